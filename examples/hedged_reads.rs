//! Hedged reads against a fleet of four `sqlhttpd` behind a round-robin balancer, one of which
//! stalls: read latency (p50, p99, max) without and with hedging, and the requests hedging added.
//!
//! ```text
//! cargo run --example hedged_reads
//! ```
//!
//! Four in-process servers (the testkit's `TestServer`, SQLite in memory) stand behind the
//! testkit's balanced `ChaosProxy`, a round-robin load balancer. The first member sits behind a
//! chaos proxy of its own that holds one answer in ten for a second (`Fault::Delay`): a member
//! that stalls now and then (a pause, a slow disk), so one read in forty waits a second. Eight
//! tasks share one client and make 100 reads each (`SELECT 1` with `fetch_one`), each task one
//! read every 40 ms at most (200 reads a second offered, the same load in both runs), first without
//! hedging, then with `hedge_reads(HedgePolicy::new().with_delay(HedgeDelay::Percentile(90)))`:
//! a read not answered after the client's recent 90th percentile is sent again on another
//! connection, which the balancer hands to the next member; the first answer wins. Its budget
//! keeps hedges to a tenth of recent reads.
//!
//! Real sockets and real time: the figures vary with the machine and its load.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sqlhttp::{Client, HedgeDelay, HedgePolicy};
use sqlhttp_testkit::{ChaosProxy, Fault, TestServer};

const MEMBERS: usize = 4;
const TASKS: usize = 8;
const READS_PER_TASK: usize = 100;
const STALL: Duration = Duration::from_secs(1);
/// One answer in this many from the stalling member is held for [`STALL`].
const STALL_EVERY: usize = 10;
/// Each task starts a read at most this often.
const PACE: Duration = Duration::from_millis(40);

struct Run {
    latencies: Vec<Duration>,
    requests: usize,
    wall: Duration,
}

impl Run {
    fn percentile(&self, p: usize) -> Duration {
        let rank = (self.latencies.len() * p).div_ceil(100).max(1) - 1;
        self.latencies[rank]
    }
}

/// One fleet, fresh for each run so that both see the same stalls at the same turns.
struct Fleet {
    _servers: Vec<TestServer>,
    _stalling: ChaosProxy,
    balancer: ChaosProxy,
}

async fn fleet() -> Fleet {
    let mut servers = Vec::new();
    for _ in 0..MEMBERS {
        servers.push(TestServer::with_config(sqlhttp_server::Config::default()).await);
    }
    let stalling = servers[0].proxy().await;
    let reads = TASKS * READS_PER_TASK * 2;
    stalling.push_all((0..reads).map(|n| {
        if n % STALL_EVERY == STALL_EVERY - 1 {
            Fault::Delay(STALL)
        } else {
            Fault::Pass
        }
    }));
    let upstreams: Vec<SocketAddr> = std::iter::once(stalling.addr())
        .chain(servers[1..].iter().map(TestServer::addr))
        .collect();
    let balancer = ChaosProxy::start_balanced(upstreams)
        .await
        .expect("the balancer starts");
    Fleet {
        _servers: servers,
        _stalling: stalling,
        balancer,
    }
}

async fn run(hedge: Option<HedgePolicy>) -> Run {
    let fleet = fleet().await;
    let client = Client::builder(fleet.balancer.url())
        .timeout(Duration::from_secs(10))
        .hedge_reads(hedge)
        .build()
        .expect("a valid configuration");
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(READS_PER_TASK);
                let mut pace = tokio::time::interval(PACE);
                pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                for _ in 0..READS_PER_TASK {
                    pace.tick().await;
                    let began = Instant::now();
                    let one: i64 = client
                        .query("SELECT 1")
                        .fetch_one()
                        .await
                        .expect("the read succeeds");
                    assert_eq!(one, 1);
                    latencies.push(began.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("no task panics"));
    }
    latencies.sort_unstable();
    Run {
        latencies,
        requests: fleet.balancer.requests(),
        wall: started.elapsed(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let reads = TASKS * READS_PER_TASK;
    println!(
        "{MEMBERS} sqlhttpd behind a round-robin balancer; one holds 1 answer in {STALL_EVERY} for {}s; \
         {TASKS} tasks x {READS_PER_TASK} reads",
        STALL.as_secs()
    );
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9} {:>14} {:>8}",
        "configuration", "p50 ms", "p99 ms", "max ms", "requests", "extra requests", "wall s"
    );
    let plain = run(None).await;
    let hedged = run(Some(
        HedgePolicy::new().with_delay(HedgeDelay::Percentile(90)),
    ))
    .await;
    for (name, run) in [("no hedging", &plain), ("hedged at p90", &hedged)] {
        let extra = run.requests.saturating_sub(reads);
        #[allow(
            clippy::cast_precision_loss,
            reason = "request counts are far below 2^52"
        )]
        let share = extra as f64 / reads as f64 * 100.0;
        println!(
            "{name:<22} {:>9.2} {:>9.2} {:>9.2} {:>9} {:>8} ({share:>4.1}%) {:>7.1}",
            ms(run.percentile(50)),
            ms(run.percentile(99)),
            ms(*run.latencies.last().expect("reads were made")),
            run.requests,
            extra,
            run.wall.as_secs_f64(),
        );
    }
    let cut = ms(plain.percentile(99)) / ms(hedged.percentile(99));
    println!("p99 cut {cut:.1}x by hedging");
}
