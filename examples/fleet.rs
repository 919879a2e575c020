//! A fleet of 1000 clients against a server that is down for 10 s and then serves a limited rate,
//! on tokio's paused clock: what jitter and the retry budget do to a retry storm.
//!
//! ```text
//! cargo run --example fleet
//! ```
//!
//! Every client is the real `sqlhttp::Client` (retry rules, backoff, jitter, the retry budget, status
//! mapping) with the network replaced by an in-process server function (the `test-util` feature), so no
//! socket is opened and simulated time passes only when every client is waiting: the run takes well
//! under a second of wall time and repeats exactly (seeded jitter). The 1000 clients are clones of one
//! client, so they share one retry budget as a service's clones do; each makes one read at t = 0 with up
//! to 10 attempts (enough to outlast the outage), 100 ms initial backoff and the 5 s cap.
//!
//! The server answers `503` without `Retry-After` for the first 10 s, then serves 200 requests per
//! second and answers `503` to the rest. It prints, per configuration, the attempts the server received,
//! the calls that succeeded and failed, the peak attempts in one second, and the time until the last
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

/// The simulated server: down, then a fixed number of requests per one-second window.
struct Server {
    started: Instant,
    /// Requests received in each second since the start.
    per_second: Mutex<Vec<u32>>,
    /// Requests served in the current second: (second, served).
    window: Mutex<(u64, u32)>,
    attempts: AtomicU64,
}

impl Server {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            per_second: Mutex::new(Vec::new()),
            window: Mutex::new((0, 0)),
            attempts: AtomicU64::new(0),
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
        let served = elapsed >= OUTAGE && {
            let mut window = self.window.lock().unwrap();
            if window.0 != second {
                *window = (second, 0);
            }
            window.1 += 1;
            window.1 <= SERVED_PER_SECOND
        };
        let (status, body) = if served { (200, ROW) } else { (503, BUSY) };
        http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Bytes::from_static(body))
            .unwrap()
    }
}

struct Outcome {
    attempts: u64,
    succeeded: usize,
    failed: usize,
    peak_per_second: u32,
    drained: Duration,
}

async fn run(jitter: Jitter, budget: Option<RetryBudget>) -> Outcome {
    let server = Arc::new(Server::new());
    let handler = server.clone();
    let client = Client::builder("http://fleet.simulated")
        .simulated_server(move |_: Request| {
            let response = handler.handle();
            async move { Ok(response) }
        })
        .retry(
            RetryPolicy::new()
                .with_max_attempts(MAX_ATTEMPTS)
                .with_initial_backoff(Duration::from_millis(100))
                .with_max_backoff(Duration::from_secs(5))
                .with_jitter(jitter)
                .with_jitter_seed(2024),
        )
        .retry_budget(budget)
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
        succeeded,
        failed: CLIENTS - succeeded,
        peak_per_second,
        drained,
    }
}

// Paused from the runtime's start: pausing later would leave timers rounded from a real instant, and the
// figures would vary from run to run.
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    println!(
        "{CLIENTS} clients, one read each at t=0, up to {MAX_ATTEMPTS} attempts; the server is down for \
         {}s, then serves {SERVED_PER_SECOND}/s",
        OUTAGE.as_secs()
    );
    println!(
        "{:<26} {:>9} {:>10} {:>7} {:>13} {:>9}",
        "configuration", "attempts", "succeeded", "failed", "peak attempts", "drained"
    );
    for (name, jitter, budget) in [
        ("no jitter", Jitter::None, None),
        ("full jitter", Jitter::Full, None),
        (
            "full jitter + budget",
            Jitter::Full,
            Some(RetryBudget::new()),
        ),
    ] {
        let wall = std::time::Instant::now();
        let outcome = run(jitter, budget).await;
        println!(
            "{name:<26} {:>9} {:>10} {:>7} {:>11}/s {:>8.1}s   ({} ms of wall time)",
            outcome.attempts,
            outcome.succeeded,
            outcome.failed,
            outcome.peak_per_second,
            outcome.drained.as_secs_f64(),
            wall.elapsed().as_millis(),
        );
    }
}
