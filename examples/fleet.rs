//! A fleet of 1000 clients against a server that is down and then short of capacity, on tokio's
//! paused clock: what jitter, the retry budget, its prices by cause and the adaptive client rate do
//! to a retry storm.
//!
//! ```text
//! cargo run --example fleet
//! ```
//!
//! Every client is the real `sqlhttp::Client` (retry rules, backoff, jitter, the retry budget, the
//! adaptive rate, status mapping) with the network replaced by an in-process server function (the
//! `test-util` feature), so no socket is opened and simulated time passes only when every client is
//! waiting: the run takes about a second of wall time and repeats exactly (seeded jitter). The 1000
//! clients are clones of one client, so they share one retry budget (and one adaptive rate) as a
//! service's clones do; each makes one read at t = 0 with up to 20 attempts, the default backoff
//! bases (100 ms after a failure, 1 s after a throttle) and the 5 s cap.
//!
//! Two scenarios, one table each:
//!
//! * **outage**: the server answers `503` without `Retry-After` (a failure) for the first 10 s, then
//!   serves 200 requests per second and answers `503` to the rest;
//! * **overload**: the server is up but serves 200 requests per second from the start and answers
//!   the rest `429` with `Retry-After: 1` (a throttle).
//!
//! It prints, per configuration, the attempts the server received and how many it refused, the
//! calls that succeeded and failed, the peak attempts in one second, and the time until the last
//! call finished.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sqlhttp::simulation::{Request, Response};
use sqlhttp::{Client, Jitter, RetryBudget, RetryPolicy};
use tokio::time::Instant;

const CLIENTS: usize = 1_000;
const OUTAGE: Duration = Duration::from_secs(10);
const SERVED_PER_SECOND: u32 = 200;
const MAX_ATTEMPTS: u32 = 20;

const ROW: &[u8] =
    br#"{"columns":[{"name":"1","type":""}],"rows":[[1]],"rows_affected":0,"last_insert_id":null}"#;
const BUSY: &[u8] = br#"{"error":{"code":"UNAVAILABLE","message":"overloaded"}}"#;
const LIMITED: &[u8] = br#"{"error":{"code":"RATE_LIMITED","message":"slow down"}}"#;

/// What the server does with a request it cannot serve.
#[derive(Clone, Copy)]
enum Scenario {
    /// Down for [`OUTAGE`], then short of capacity; `503` without `Retry-After` throughout.
    Outage,
    /// Short of capacity from the start; `429` with `Retry-After: 1`.
    Overload,
}

/// The simulated server: a fixed number of requests served per one-second window.
struct Server {
    scenario: Scenario,
    started: Instant,
    /// Requests received in each second since the start.
    per_second: Mutex<Vec<u32>>,
    /// Requests served in the current second: (second, served).
    window: Mutex<(u64, u32)>,
    attempts: AtomicU64,
    refused: AtomicU64,
}

impl Server {
    fn new(scenario: Scenario) -> Self {
        Self {
            scenario,
            started: Instant::now(),
            per_second: Mutex::new(Vec::new()),
            window: Mutex::new((0, 0)),
            attempts: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn handle(&self) -> Response {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let elapsed = self.started.elapsed();
        let second = elapsed.as_secs();
        {
            let mut per_second = self.per_second.lock().unwrap();
            let index = usize::try_from(second).unwrap();
            if per_second.len() <= index {
                per_second.resize(index + 1, 0);
            }
            per_second[index] += 1;
        }
        let up = match self.scenario {
            Scenario::Outage => elapsed >= OUTAGE,
            Scenario::Overload => true,
        };
        let served = up && {
            let mut window = self.window.lock().unwrap();
            if window.0 != second {
                *window = (second, 0);
            }
            window.1 += 1;
            window.1 <= SERVED_PER_SECOND
        };
        let response = http::Response::builder().header("content-type", "application/json");
        if served {
            return response.status(200).body(Bytes::from_static(ROW)).unwrap();
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        match self.scenario {
            Scenario::Outage => response.status(503).body(Bytes::from_static(BUSY)),
            Scenario::Overload => response
                .status(429)
                .header("retry-after", "1")
                .body(Bytes::from_static(LIMITED)),
        }
        .unwrap()
    }
}

struct Outcome {
    attempts: u64,
    refused: u64,
    succeeded: usize,
    failed: usize,
    peak_per_second: u32,
    drained: Duration,
}

/// One configuration of the fleet's client.
struct Setup {
    name: &'static str,
    jitter: Jitter,
    budget: Option<RetryBudget>,
    adaptive: bool,
}

async fn run(scenario: Scenario, setup: &Setup) -> Outcome {
    let server = Arc::new(Server::new(scenario));
    let handler = server.clone();
    let client = Client::builder("http://fleet.simulated")
        .simulated_server(move |_: Request| {
            let response = handler.handle();
            async move { Ok(response) }
        })
        .retry(
            RetryPolicy::new()
                .with_max_attempts(MAX_ATTEMPTS)
                .with_jitter(setup.jitter)
                .with_jitter_seed(2024),
        )
        .retry_budget(setup.budget)
        .adaptive_rate(setup.adaptive)
        .build()
        .expect("a valid configuration");
    let started = Instant::now();
    let calls: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let outcome = client.ping().await;
                (outcome.is_ok(), started.elapsed())
            })
        })
        .collect();
    let mut succeeded = 0;
    let mut drained = Duration::ZERO;
    for call in calls {
        let (ok, finished) = call.await.expect("no call panics");
        succeeded += usize::from(ok);
        drained = drained.max(finished);
    }
    let peak_per_second = server
        .per_second
        .lock()
        .unwrap()
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    Outcome {
        attempts: server.attempts.load(Ordering::Relaxed),
        refused: server.refused.load(Ordering::Relaxed),
        succeeded,
        failed: CLIENTS - succeeded,
        peak_per_second,
        drained,
    }
}

/// The budget before retries were priced by cause: every retry 5 tokens, 10 after a timeout.
const ONE_PRICE_5: RetryBudget = RetryBudget::new()
    .with_throttle_cost(5)
    .with_retry_cost(5)
    .with_timeout_cost(10);
/// Every retry at the failure's price.
const ONE_PRICE_14: RetryBudget = RetryBudget::new().with_throttle_cost(14);

async fn table(scenario: Scenario, title: &str, setups: &[Setup]) {
    println!("\n{title}");
    println!(
        "{:<40} {:>9} {:>8} {:>10} {:>7} {:>13} {:>9}",
        "configuration", "attempts", "refused", "succeeded", "failed", "peak attempts", "drained"
    );
    for setup in setups {
        let wall = std::time::Instant::now();
        let outcome = run(scenario, setup).await;
        println!(
            "{:<40} {:>9} {:>8} {:>10} {:>7} {:>11}/s {:>8.1}s   ({} ms of wall time)",
            setup.name,
            outcome.attempts,
            outcome.refused,
            outcome.succeeded,
            outcome.failed,
            outcome.peak_per_second,
            outcome.drained.as_secs_f64(),
            wall.elapsed().as_millis(),
        );
    }
}

// Paused from the runtime's start: pausing later would leave timers rounded from a real instant, and the
// figures would vary from run to run.
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    println!(
        "{CLIENTS} clients (clones of one client), one read each at t=0, up to {MAX_ATTEMPTS} attempts"
    );
    let by_cause = Some(RetryBudget::new());
    table(
        Scenario::Outage,
        &format!(
            "outage: 503 without Retry-After for {}s, then {SERVED_PER_SECOND}/s served, 503 to the rest",
            OUTAGE.as_secs()
        ),
        &[
            Setup {
                name: "no jitter",
                jitter: Jitter::None,
                budget: None,
                adaptive: false,
            },
            Setup {
                name: "full jitter",
                jitter: Jitter::Full,
                budget: None,
                adaptive: false,
            },
            Setup {
                name: "full jitter + budget, every retry 5",
                jitter: Jitter::Full,
                budget: Some(ONE_PRICE_5),
                adaptive: false,
            },
            Setup {
                name: "full jitter + budget by cause (14)",
                jitter: Jitter::Full,
                budget: by_cause,
                adaptive: false,
            },
        ],
    )
    .await;
    table(
        Scenario::Overload,
        &format!(
            "overload: {SERVED_PER_SECOND}/s served from t=0, 429 with Retry-After: 1 to the rest"
        ),
        &[
            Setup {
                name: "full jitter + budget, every retry 14",
                jitter: Jitter::Full,
                budget: Some(ONE_PRICE_14),
                adaptive: false,
            },
            Setup {
                name: "full jitter + budget by cause (5)",
                jitter: Jitter::Full,
                budget: by_cause,
                adaptive: false,
            },
            Setup {
                name: "full jitter + budget by cause + adaptive",
                jitter: Jitter::Full,
                budget: by_cause,
                adaptive: true,
            },
        ],
    )
    .await;
}
