//! Reads through every fault a network can make recover, and return exactly the rows the database
//! holds, with the number of attempts the plan implies.

use std::time::Duration;

use sqlhttp::Client;
use sqlhttp_testkit::{ChaosProxy, Fault};

use crate::harness::*;

/// A live server with `rows` items in a fresh table, and a proxy in front of it.
struct Scene {
    live: Live,
    table: String,
    rows: Vec<Item>,
    proxy: ChaosProxy,
}

async fn scene(rows: usize) -> Scene {
    let live = Live::start().await;
    let table = unique_table("faults");
    let rows = seed(&live.client(), &table, rows).await;
    let proxy = live.proxy().await;
    Scene {
        live,
        table,
        rows,
        proxy,
    }
}

impl Scene {
    fn client(&self) -> Client {
        self.live.via(&self.proxy).build().unwrap()
    }

    /// Reads every row through the proxy after planning `faults`; checks the rows and the attempts.
    async fn read_through(&self, faults: Vec<Fault>, forwarded: usize) {
        let planned = faults.len();
        self.proxy.push_all(faults);
        let got = all_rows(&self.client(), &self.table).await;
        assert_eq!(
            got, self.rows,
            "the recovered read returns exactly what the database holds"
        );
        assert_eq!(
            self.proxy.requests(),
            planned + 1,
            "one attempt per fault, then one that passed"
        );
        assert_eq!(
            self.proxy.forwarded(),
            forwarded,
            "requests that reached the server"
        );
    }
}

#[tokio::test]
async fn closed_before_forwarding() {
    scene(40)
        .await
        .read_through(vec![Fault::CloseBeforeForward; 2], 1)
        .await;
}

#[tokio::test]
async fn reset_before_forwarding() {
    scene(40)
        .await
        .read_through(vec![Fault::ResetBeforeForward; 2], 1)
        .await;
}

#[tokio::test]
async fn response_dropped_after_the_server_answered() {
    scene(40)
        .await
        .read_through(vec![Fault::DropAfterForward; 2], 3)
        .await;
}

#[tokio::test]
async fn truncated_in_the_head_and_in_the_body() {
    // 40 rows make a body of several kilobytes: 30 bytes cut the status line, 600 the body.
    scene(40)
        .await
        .read_through(vec![Fault::Truncate(30), Fault::Truncate(600)], 3)
        .await;
}

#[tokio::test]
async fn gateway_and_server_errors() {
    let faults = vec![
        Fault::status(502),
        Fault::unavailable(0),
        Fault::status(504),
        Fault::error(500, "INTERNAL", "internal error"),
    ];
    let s = scene(40).await;
    s.proxy.push_all(faults);
    let client = s
        .live
        .via(&s.proxy)
        .retry(fast().with_max_attempts(5))
        .build()
        .unwrap();
    assert_eq!(all_rows(&client, &s.table).await, s.rows);
    assert_eq!((s.proxy.requests(), s.proxy.forwarded()), (5, 1));
}

#[tokio::test]
async fn rate_limited_waits_for_retry_after() {
    let s = scene(10).await;
    s.proxy.push(Fault::rate_limited(1));
    let client = s
        .live
        .via(&s.proxy)
        .retry(fast().with_max_backoff(Duration::from_secs(5)))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    assert_eq!(all_rows(&client, &s.table).await, s.rows);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!((s.proxy.requests(), s.proxy.forwarded()), (2, 1));
}

#[tokio::test]
async fn an_attempt_stalled_past_its_timeout() {
    let s = scene(10).await;
    s.proxy.push(Fault::Stall);
    let client = s
        .live
        .via(&s.proxy)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert_eq!(all_rows(&client, &s.table).await, s.rows);
    assert_eq!((s.proxy.requests(), s.proxy.forwarded()), (2, 1));
}

#[tokio::test]
async fn a_slow_response_within_the_timeout_is_waited_for() {
    let s = scene(10).await;
    s.proxy.push(Fault::Delay(Duration::from_millis(200)));
    let client = s
        .live
        .via(&s.proxy)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert_eq!(all_rows(&client, &s.table).await, s.rows);
    assert_eq!(s.proxy.requests(), 1);
}

#[tokio::test]
async fn every_fault_in_one_sequence() {
    let s = scene(25).await;
    s.proxy.push_all([
        Fault::CloseBeforeForward,
        Fault::ResetBeforeForward,
        Fault::DropAfterForward,
        Fault::Truncate(600),
        Fault::status(502),
        Fault::unavailable(0),
        Fault::status(504),
        Fault::rate_limited(0),
        Fault::Stall,
    ]);
    let client = s
        .live
        .via(&s.proxy)
        .timeout(Duration::from_millis(300))
        .retry(fast().with_max_attempts(10))
        .build()
        .unwrap();
    assert_eq!(all_rows(&client, &s.table).await, s.rows);
    assert_eq!((s.proxy.requests(), s.proxy.forwarded()), (10, 3));
}

#[tokio::test]
async fn faults_beyond_the_attempts_return_the_last_one() {
    let s = scene(5).await;
    s.proxy
        .push_all([Fault::status(502), Fault::status(503), Fault::status(504)]);
    let err = s
        .client()
        .query("SELECT 1")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!((err.status(), err.attempts()), (Some(504), 3));
    let statuses: Vec<_> = err.history().iter().map(|a| a.status).collect();
    assert_eq!(statuses, vec![Some(502), Some(503), Some(504)]);
    assert_eq!(s.proxy.forwarded(), 0);
}

/// An `INSERT` sent through `query` is a miscategorised write: the server refuses it as a read
/// (the SDK marks reads `read_only`), so even when the first answer is lost and the SDK retries,
/// nothing is written, and the caller learns why.
#[tokio::test]
async fn a_write_sent_as_a_query_is_never_applied_even_when_retried() {
    let s = scene(3).await;
    let before = all_rows(&s.live.client(), &s.table).await;
    s.proxy.push(Fault::DropAfterForward);
    let sql = format!(
        "INSERT INTO {} (id, name, price) VALUES (1000, 'twice?', 1.5)",
        s.table
    );
    let err = s
        .client()
        .query(sql.as_str())
        .fetch_all::<serde_json::Value>()
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), sqlhttp::ErrorKind::ReadOnly { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("execute"),
        "says what to use: {err}"
    );
    assert_eq!(
        (err.attempts(), s.proxy.forwarded()),
        (2, 2),
        "the lost answer was retried as a read, and refused again"
    );
    assert_eq!(
        all_rows(&s.live.client(), &s.table).await,
        before,
        "applied zero times"
    );
}
