//! Two replicas, one database: two `sqlhttpd` processes on the same PostgreSQL database behind
//! a balancing chaos proxy, driven by the SDK as an application behind a load balancer would
//! be. The idempotency store lives in the database, so a keyed write whose response one replica
//! lost is replayed by the other, and a replica killed under load loses no acknowledged write.
//!
//! The database comes from [`database`]: these tests skip as the other PostgreSQL tests do.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlhttp::{Client, RetryPolicy};
use sqlhttp_testkit::{ChaosProxy, Fault, ServerProcess};
use tokio::sync::watch;

use crate::common::sqlhttpd;
use crate::engines::{client_role, database, needs_postgres};
use crate::operations::observability::sample;

/// Two replicas of `sqlhttpd` on the database at `url`, started together (killed on drop),
/// logging warnings and errors only.
pub(super) async fn replicas(url: &str) -> (ServerProcess, ServerProcess) {
    let replica = || {
        let mut command = sqlhttpd();
        // ServerProcess reads stdout; stderr goes to the test's output, not to a pipe nobody reads.
        command
            .args(["--database", url, "--client-role", &client_role(url)])
            .stderr(Stdio::inherit());
        ServerProcess::spawn_command(command)
    };
    let (a, b) = tokio::join!(replica(), replica());
    (a.unwrap(), b.unwrap())
}

/// Retries quickly and often: a replica that is down costs a few milliseconds, not seconds.
pub(super) fn quick_retries() -> RetryPolicy {
    RetryPolicy::new()
        .with_max_attempts(20)
        .with_initial_backoff(Duration::from_millis(5))
        .with_max_backoff(Duration::from_millis(100))
        .with_max_elapsed(Duration::from_secs(10))
}

/// A client that talks to one replica directly, for setup and checks.
pub(super) fn direct(replica: &ServerProcess) -> Client {
    Client::builder(replica.url()).build().unwrap()
}

/// The value of one series in a replica's `GET /metrics`.
async fn metric(replica: &ServerProcess, series: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", replica.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    sample(&text, series)
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Order {
    id: i64,
    item: String,
}

needs_postgres! {
    #[tokio::test]
    async fn a_write_whose_response_was_lost_on_one_replica_is_replayed_by_the_other() {
        let Some(url) =
            database("a_write_whose_response_was_lost_on_one_replica_is_replayed_by_the_other").await
        else {
            return;
        };
        let (a, b) = replicas(&url).await;
        // No primary key: only the idempotency key stands between the retry and a second row.
        direct(&a)
            .execute("CREATE TABLE orders (id bigint NOT NULL, item text NOT NULL)")
            .await
            .unwrap();
        let proxy = ChaosProxy::start_balanced([a.addr(), b.addr()])
            .await
            .unwrap();
        // The first attempt reaches A, which commits; its response is lost on the way back.
        proxy.push(Fault::DropAfterForward);
        let client = Client::builder(proxy.url())
            .retry(quick_retries())
            .retry_writes(true)
            .build()
            .unwrap();

        let order = Order {
            id: 1,
            item: "lamp".to_owned(),
        };
        let inserted = client
            .insert("orders", std::slice::from_ref(&order))
            .idempotency_key("order-1")
            .await
            .unwrap();

        assert_eq!(inserted, 1, "the retried call succeeded");
        assert_eq!(
            (
                proxy.requests(),
                proxy.forwarded_to(a.addr()),
                proxy.forwarded_to(b.addr())
            ),
            (2, 1, 1),
            "the first attempt went to A, the retry to B"
        );
        let rows: Vec<Order> = direct(&b)
            .query("SELECT id, item FROM orders")
            .fetch_all()
            .await
            .unwrap();
        assert_eq!(rows, [order], "applied once");
        // B answered from the outcome A stored in the shared database, without running the insert.
        let replays = "sqlhttpd_idempotent_replays_total";
        assert_eq!(metric(&b, replays).await, Some(1.0), "B replayed");
        assert_eq!(metric(&a, replays).await, Some(0.0), "A ran the write");
    }
}

#[derive(Debug, Serialize)]
struct Event {
    id: i64,
    writer: i64,
}

/// Where the load is relative to the kill of replica A.
const BEFORE_KILL: u8 = 0;
const KILLING: u8 = 1;
const AFTER_KILL: u8 = 2;

/// Acknowledged writes so far: those acknowledged before the kill began, and those sent and
/// acknowledged after it was over.
#[derive(Debug, Default, Clone, Copy)]
struct Acks {
    before: usize,
    after: usize,
}

/// What became of one write.
#[derive(Debug)]
struct Write {
    id: i64,
    acknowledged: bool,
}

needs_postgres! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killing_a_replica_under_load_loses_no_acknowledged_write() {
        const WRITERS: i64 = 8;
        /// Acknowledged writes to wait for on each side of the kill.
        const ACKS_PER_SIDE: usize = 40;
        /// A bound on each wait for the load to make progress.
        const PROGRESS_TIMEOUT: Duration = Duration::from_secs(10);

        let Some(url) = database("killing_a_replica_under_load_loses_no_acknowledged_write").await
        else {
            return;
        };
        let (a, b) = replicas(&url).await;
        let a_addr = a.addr();
        // No primary key: a write applied twice shows as a second row, not as an error.
        direct(&b)
            .execute("CREATE TABLE events (id bigint NOT NULL, writer bigint NOT NULL)")
            .await
            .unwrap();
        let proxy = ChaosProxy::start_balanced([a_addr, b.addr()])
            .await
            .unwrap();
        // Every insert carries a key the SDK makes, the same on each of its attempts.
        let client = Client::builder(proxy.url())
            .retry(quick_retries())
            .retry_writes(true)
            .retry_budget(None)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();

        let phase = Arc::new(AtomicU8::new(BEFORE_KILL));
        let stop = Arc::new(AtomicBool::new(false));
        let (acks, mut progress) = watch::channel(Acks::default());
        let acks = Arc::new(acks);
        let mut writers = tokio::task::JoinSet::new();
        for writer in 0..WRITERS {
            let (client, phase, stop, acks) = (
                client.clone(),
                Arc::clone(&phase),
                Arc::clone(&stop),
                Arc::clone(&acks),
            );
            writers.spawn(async move {
                let mut writes = Vec::new();
                for seq in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = writer * 1_000_000 + seq;
                    let sent_in = phase.load(Ordering::SeqCst);
                    let result = client.insert("events", &[Event { id, writer }]).await;
                    let acked_in = phase.load(Ordering::SeqCst);
                    match &result {
                        Ok(inserted) => assert_eq!(*inserted, 1, "write {id}"),
                        Err(error) => eprintln!("write {id} failed: {error}"),
                    }
                    let acknowledged = result.is_ok();
                    if acknowledged && acked_in == BEFORE_KILL {
                        acks.send_modify(|acks| acks.before += 1);
                    } else if acknowledged && sent_in == AFTER_KILL {
                        acks.send_modify(|acks| acks.after += 1);
                    }
                    writes.push(Write { id, acknowledged });
                }
                writes
            });
        }

        tokio::time::timeout(
            PROGRESS_TIMEOUT,
            progress.wait_for(|acks| acks.before >= ACKS_PER_SIDE),
        )
        .await
        .expect("writes are acknowledged before the kill")
        .unwrap();
        let a_forwarded = proxy.forwarded_to(a_addr);
        assert!(a_forwarded > 0, "A took part of the load before the kill");
        phase.store(KILLING, Ordering::SeqCst);
        a.kill().await.unwrap();
        phase.store(AFTER_KILL, Ordering::SeqCst);
        tokio::time::timeout(
            PROGRESS_TIMEOUT,
            progress.wait_for(|acks| acks.after >= ACKS_PER_SIDE),
        )
        .await
        .expect("writes sent after the kill are acknowledged (by B)")
        .unwrap();
        stop.store(true, Ordering::SeqCst);
        let writes: Vec<Write> = writers.join_all().await.into_iter().flatten().collect();

        // The proxy's turns for A now fail over to B.
        assert!(
            proxy.failed_connects_to(a_addr) > 0,
            "requests meant for A after the kill were refused: {proxy:?}"
        );
        let ids: Vec<i64> = direct(&b)
            .query("SELECT id FROM events")
            .fetch_all()
            .await
            .unwrap();
        let mut copies: HashMap<i64, usize> = HashMap::new();
        for id in ids {
            *copies.entry(id).or_default() += 1;
        }
        let duplicated: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            duplicated.is_empty(),
            "writes applied twice: {duplicated:?}"
        );
        let lost: Vec<i64> = writes
            .iter()
            .filter(|write| write.acknowledged && !copies.contains_key(&write.id))
            .map(|write| write.id)
            .collect();
        assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
        let sent: HashSet<i64> = writes.iter().map(|write| write.id).collect();
        assert!(
            copies.keys().all(|id| sent.contains(id)),
            "rows nobody wrote"
        );
        let failed = writes.iter().filter(|write| !write.acknowledged).count();
        let acks = *progress.borrow();
        eprintln!(
            "{} writes in {} requests: {} acknowledged before the kill, {} sent and acknowledged \
         after it, {failed} failed ({} of those applied); A was sent {a_forwarded} requests \
         before the kill, {} connections to it were refused after",
            writes.len(),
            proxy.requests(),
            acks.before,
            acks.after,
            writes
                .iter()
                .filter(|w| !w.acknowledged && copies.contains_key(&w.id))
                .count(),
            proxy.failed_connects_to(a_addr),
        );
    }
}
