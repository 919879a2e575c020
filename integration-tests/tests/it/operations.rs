//! The SDK against a rate-limiting `sqlhttpd` (in-process servers with `rate_limit` and a token):
//! a limited call waits out the server's `Retry-After` and succeeds; a fleet converges on the
//! limit without a retry storm, whether it is clones sharing one retry budget or separate clients,
//! counted on the server's own `/metrics`. Also: the request id of a failure, and a read-only
//! token's writes refused as `ErrorKind::ReadOnly`.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use sqlhttp::{Client, ErrorKind, RetryBudget, RetryPolicy};
use sqlhttp_server::{Config, RateLimit};

use crate::harness::*;

fn limited(per_second: u32, burst: u32) -> Config {
    Config {
        tokens: vec!["fleet-token".into()],
        rate_limit: Some(RateLimit {
            per_second: NonZeroU32::new(per_second).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        }),
        ..Config::default()
    }
}

/// Retries that honour a `Retry-After` of a second or two.
fn patient() -> RetryPolicy {
    RetryPolicy::new()
        .with_max_attempts(5)
        .with_initial_backoff(Duration::from_millis(10))
        .with_max_backoff(Duration::from_secs(2))
        .with_jitter_seed(3)
}

/// What the server answered on the SQL endpoint so far: `(200s, 429s)`, from its `/metrics`.
async fn server_counts(live: &Live) -> (u64, u64) {
    let text = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{}/metrics", live.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |status: u16| {
        let series =
            format!(r#"sqlhttpd_requests_total{{endpoint="/api/v1/sql",status="{status}"}} "#);
        text.lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .map_or(0, |value| value.parse().unwrap())
    };
    (count(200), count(429))
}

#[tokio::test]
async fn a_rate_limited_call_waits_out_retry_after_then_succeeds() {
    let live = Live::with_config(limited(1, 1)).await;
    let client = live.builder().retry(patient()).build().unwrap();
    client.ping().await.unwrap();
    let started = Instant::now();
    client.ping().await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(server_counts(&live).await, (2, 1));

    // Without retries, the 429 comes back with its wait and the server's request id.
    let once = live.builder().retry(RetryPolicy::never()).build().unwrap();
    let err = once.ping().await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::RateLimited { .. }),
        "{err:?}"
    );
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    let id = err.request_id().expect("the server names the request");
    assert_eq!(id.len(), 32, "{id}");
    assert_eq!(err.history()[0].request_id.as_deref(), Some(id));
}

/// Sends one ping from each client at once; returns how many succeeded, how many gave up because
/// the retry budget was empty, and how long the last call took.
async fn fleet_ping(clients: Vec<Client>) -> (usize, usize, Duration) {
    let started = Instant::now();
    let calls: Vec<_> = clients
        .into_iter()
        .map(|client| tokio::spawn(async move { client.ping().await }))
        .collect();
    let (mut ok, mut budget) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(()) => ok += 1,
            Err(err) if err.is_budget_exhausted() => {
                assert!(
                    matches!(err.kind(), ErrorKind::RateLimited { .. }),
                    "{err:?}"
                );
                budget += 1;
            }
            Err(err) => panic!("{err:?}"),
        }
    }
    (ok, budget, started.elapsed())
}

const FLEET: usize = 60;
/// 10 retries from a full bucket: small enough for the fleet to run it dry.
const SMALL_BUDGET: RetryBudget = RetryBudget::new()
    .with_capacity(50)
    .with_retry_cost(5)
    .with_success_deposit(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_converges_on_the_limit_without_a_storm() {
    // 60 calls against 20 a second with a burst of 20: at best 20 now, 20 after each second.
    // Clones share one budget: it pays for a few retries, then the rest fail at once.
    let live = Live::with_config(limited(20, 20)).await;
    let client = live
        .builder()
        .retry(patient())
        .retry_budget(SMALL_BUDGET)
        .build()
        .unwrap();
    let (ok, gave_up, took) = fleet_ping(vec![client; FLEET]).await;
    let (served, refused) = server_counts(&live).await;
    println!(
        "clones: {ok} ok, {gave_up} gave up, server {served} served + {refused} refused, {took:?}"
    );
    assert_eq!(ok + gave_up, FLEET);
    assert_eq!(served, ok as u64);
    let retries = served + refused - FLEET as u64;
    // 50 tokens at 5 a retry, plus 1 per success: a couple of dozen retries at most.
    assert!(retries <= (50 + FLEET as u64) / 5, "{retries} retries");
    assert!(gave_up >= FLEET - 20 - 22, "{gave_up} gave up");
    assert!(ok >= 20, "the burst is served: {ok}");
    assert!(took < Duration::from_secs(6), "{took:?}");

    // Separate clients each have a budget of their own: all wait their turn and get in, in waves
    // a Retry-After apart, and the server sees each call at most three times.
    let live = Live::with_config(limited(20, 20)).await;
    let clients = (0..FLEET)
        .map(|_| {
            live.builder()
                .retry(patient())
                .retry_budget(SMALL_BUDGET)
                .build()
                .unwrap()
        })
        .collect();
    let (ok, gave_up, took) = fleet_ping(clients).await;
    let (served, refused) = server_counts(&live).await;
    println!(
        "separate: {ok} ok, {gave_up} gave up, server {served} served + {refused} refused, {took:?}"
    );
    assert_eq!((ok, gave_up), (FLEET, 0));
    assert_eq!(served, FLEET as u64);
    // Waves of 60, 40 and 20 (a little more if a wave straddles a refill).
    assert!(refused <= 40 + 20 + 10, "{refused} refused: a storm");
    assert!(served + refused <= 3 * FLEET as u64);
    // The limit holds: 40 calls past the burst need two seconds at 20 a second.
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert!(retries < refused, "clones sharing a budget retried less");
}

#[tokio::test]
async fn a_read_token_reads_and_its_writes_are_read_only_errors() {
    let live = Live::with_config(Config {
        tokens: vec!["admin".into()],
        read_tokens: vec!["viewer".into()],
        ..Config::default()
    })
    .await;
    let admin = live.client();
    let table = unique_table("read_only");
    seed(&admin, &table, 3).await;
    let viewer = live.builder().bearer_token("viewer").build().unwrap();
    assert_eq!(count(&viewer, &table).await, 3);
    let err = viewer
        .insert(&table, &items(1))
        .retry_writes(true)
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::ReadOnly { .. }), "{err:?}");
    assert_eq!(err.attempts(), 1, "final: not retried");
    assert!(!err.is_outcome_unknown());
    let err = viewer
        .execute(format!("DROP TABLE \"{table}\""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("READ_ONLY"));
    assert!(err.request_id().is_some());
    assert_eq!(count(&admin, &table).await, 3);
}
