//! Hedged reads against real servers: two in-process `sqlhttpd` behind the testkit's
//! round-robin balancer, the first behind a chaos proxy that stalls one answer. A hedged read
//! stuck on the stalled member is answered by the other; a write asked to hedge is sent once.

use std::time::{Duration, Instant};

use sqlhttp::{Client, ErrorKind, HedgeDelay, HedgePolicy};
use sqlhttp_testkit::{ChaosProxy, Fault, TestServer};

struct Pair {
    _servers: [TestServer; 2],
    stalling: ChaosProxy,
    balancer: ChaosProxy,
}

async fn pair() -> Pair {
    let first = TestServer::with_config(sqlhttp_server::Config::default()).await;
    let second = TestServer::with_config(sqlhttp_server::Config::default()).await;
    let stalling = first.proxy().await;
    let balancer = ChaosProxy::start_balanced([stalling.addr(), second.addr()])
        .await
        .unwrap();
    Pair {
        _servers: [first, second],
        stalling,
        balancer,
    }
}

fn hedging(pair: &Pair) -> Client {
    Client::builder(pair.balancer.url())
        .timeout(Duration::from_secs(20))
        .hedge_reads(HedgePolicy::new().with_delay(HedgeDelay::Fixed(Duration::from_millis(100))))
        .build()
        .unwrap()
}

/// Ten quick reads earn the hedge budget one hedge (10% of reads) and leave the balancer's next
/// turn on the stalling member.
async fn warm_up(client: &Client) {
    for _ in 0..10 {
        let one: i64 = client.query("SELECT 1").fetch_one().await.unwrap();
        assert_eq!(one, 1);
    }
}

#[tokio::test]
async fn a_read_stalled_on_one_member_is_answered_by_the_other() {
    let pair = pair().await;
    let client = hedging(&pair);
    warm_up(&client).await;
    pair.stalling.push(Fault::Stall);
    let started = Instant::now();
    let one: i64 = client.query("SELECT 1").fetch_one().await.unwrap();
    let took = started.elapsed();
    assert_eq!(one, 1);
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(5),
        "answered by the hedge, not after the stall: {took:?}"
    );
    assert_eq!(client.retry_state().hedges_sent(), 1);
    assert_eq!(
        pair.balancer.requests(),
        12,
        "ten reads, one read and its hedge"
    );
}

#[tokio::test]
async fn a_write_asked_to_hedge_is_sent_once() {
    let pair = pair().await;
    let client = hedging(&pair);
    warm_up(&client).await;
    pair.stalling.push(Fault::Stall);
    let err = client
        .batch()
        .statement("CREATE TABLE t (x INTEGER)")
        .hedge(true)
        .timeout(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Timeout { .. }), "{err:?}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(client.retry_state().hedges_sent(), 0);
    assert_eq!(pair.balancer.requests(), 11, "the write went once");
}
