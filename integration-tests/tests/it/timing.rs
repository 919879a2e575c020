//! The per-attempt timeout, the `max_elapsed` ceiling and cancellation, against a proxy that stalls.
//! These run in real time; bounds are loose enough for a loaded 2-core machine and tight enough to
//! fail if the client waited for the stalled attempt or slept through a cancellation.

use std::time::{Duration, Instant};

use sqlhttp::{CancellationToken, ErrorKind};
use sqlhttp_testkit::Fault;

use crate::harness::*;

#[tokio::test]
async fn every_stalled_attempt_times_out_and_the_last_timeout_is_returned() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    proxy.push_all(vec![Fault::Stall; 3]);
    let client = live
        .via(&proxy)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(
        err.kind(),
        &ErrorKind::Timeout {
            after: Duration::from_millis(200)
        }
    );
    assert_eq!(
        (err.attempts(), proxy.requests(), proxy.forwarded()),
        (3, 3, 0)
    );
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn max_elapsed_cuts_a_stalled_attempt() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    proxy.push_all(vec![Fault::Stall; 3]);
    let client = live
        .via(&proxy)
        .timeout(Duration::from_secs(30))
        .retry(fast().with_max_elapsed(Duration::from_millis(400)))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    let took = started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(err.attempts(), 1);
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn cancelling_during_a_long_backoff_returns_promptly_and_nothing_runs_after() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    proxy.push_all(vec![Fault::unavailable(30); 3]);
    let client = live
        .via(&proxy)
        .retry(
            fast()
                .with_max_backoff(Duration::from_secs(60))
                // Honour the server's 30 s in full (by default it is held to the computed
                // delay plus 5 s).
                .with_retry_after_max_extra(Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let err = client
        .query("SELECT 1")
        .cancel_on(&token)
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), &ErrorKind::Cancelled);
    let slept = err.history()[0].retry_delay.unwrap();
    assert!(
        slept >= Duration::from_secs(30) && slept <= Duration::from_secs(33),
        "it was sleeping 30 s, plus up to a tenth spread by full jitter: {slept:?}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(proxy.requests(), 1, "no attempt ran after the cancellation");
}

#[tokio::test]
async fn cancelling_a_stalled_attempt_returns_promptly() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    proxy.push(Fault::Stall);
    let token = CancellationToken::new();
    let client = live.via(&proxy).cancel_on(&token).build().unwrap();
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (&ErrorKind::Cancelled, 1));
    assert!(started.elapsed() < Duration::from_secs(3));
}
