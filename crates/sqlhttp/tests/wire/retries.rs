//! The retry rules through the public API: what is retried per method, how long the client waits,
//! when it stops, and what it reports. All on tokio's paused clock.

use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use sqlhttp::{ErrorKind, Jitter, RetryBudget, RetryPolicy};
use tokio::time::Instant;
use wiremock::ResponseTemplate;

use crate::support::*;

fn unavailable() -> ResponseTemplate {
    error(503, "UNAVAILABLE", "database is locked")
}

#[derive(Serialize)]
struct Row {
    n: i64,
}

#[tokio::test(start_paused = true)]
async fn a_read_recovers_after_two_503s_and_returns_the_rows() {
    let server = server().await;
    respond_times(&server, unavailable(), 2).await;
    respond_always(&server, ok_rows(&["n"], &json!([[1], [2], [3]]))).await;
    let client = builder(&server).build().unwrap();
    let rows: Vec<i64> = client.query("SELECT n FROM t").fetch_all().await.unwrap();
    assert_eq!(rows, vec![1, 2, 3]);
    assert_eq!(attempt_headers(&server).await, vec!["1/3", "2/3", "3/3"]);
}

#[tokio::test(start_paused = true)]
async fn every_read_method_is_retried_by_default() {
    let server = server().await;
    respond_times(&server, unavailable(), 1).await;
    respond_times(&server, ok_rows(&["n"], &json!([[1]])), 1).await;
    respond_times(&server, ResponseTemplate::new(502), 1).await;
    respond_times(&server, ok_rows(&["n"], &json!([[1]])), 1).await;
    respond_times(&server, ResponseTemplate::new(504), 1).await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server).build().unwrap();
    client.ping().await.unwrap();
    client.query("SELECT n").fetch_one::<i64>().await.unwrap();
    client.query_table("SELECT n").await.unwrap();
    assert_eq!(hits(&server).await, 6);
}

#[tokio::test(start_paused = true)]
async fn a_501_is_final() {
    let server = server().await;
    respond_always(&server, error(501, "NOT_IMPLEMENTED", "no")).await;
    let client = builder(&server).build().unwrap();
    let err = client.ping().await.unwrap_err();
    assert_eq!((err.status(), err.attempts()), (Some(501), 1));
    assert_eq!(hits(&server).await, 1);
}

#[tokio::test(start_paused = true)]
async fn final_4xx_are_not_retried() {
    for (status, code) in [
        (400, "SQL_ERROR"),
        (400, "BAD_REQUEST"),
        (401, "UNAUTHORIZED"),
        (404, "NOT_FOUND"),
        (409, "CONSTRAINT_VIOLATION"),
        (413, "PAYLOAD_TOO_LARGE"),
        (422, "IDEMPOTENCY_KEY_REUSED"),
    ] {
        let server = server().await;
        respond_always(&server, error(status, code, "no")).await;
        let client = builder(&server).build().unwrap();
        let err = client
            .query("SELECT 1")
            .fetch_all::<i64>()
            .await
            .unwrap_err();
        assert_eq!((err.status(), err.attempts()), (Some(status), 1), "{code}");
        assert_eq!(hits(&server).await, 1, "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_408_and_a_500_are_retried() {
    let server = server().await;
    respond_times(&server, ResponseTemplate::new(408), 1).await;
    respond_times(&server, error(500, "INTERNAL", "oops"), 1).await;
    respond_always(&server, ok_rows(&["n"], &json!([[5]]))).await;
    let client = builder(&server).build().unwrap();
    assert_eq!(
        client.query("SELECT n").fetch_one::<i64>().await.unwrap(),
        5
    );
    assert_eq!(hits(&server).await, 3);
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_is_waited_for() {
    let server = server().await;
    respond_times(
        &server,
        error(429, "RATE_LIMITED", "slow down").insert_header("retry-after", "2"),
        1,
    )
    .await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server).build().unwrap();
    let started = Instant::now();
    client.ping().await.unwrap();
    let waited = started.elapsed();
    assert!(
        // 2 s, plus up to a tenth of it spread at random (full jitter).
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2_300),
        "{waited:?}"
    );
    assert_eq!(hits(&server).await, 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_held_to_the_computed_delay_plus_5_s() {
    let server = server().await;
    respond_always(&server, unavailable().insert_header("retry-after", "3600")).await;
    let client = client_with(
        &server,
        RetryPolicy::new()
            .with_max_attempts(2)
            .with_max_backoff(Duration::from_secs(5))
            .with_jitter(Jitter::None),
    );
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    // A throttle's computed first delay is 1 s; the server's hour is held to 1 s + 5 s.
    assert_eq!(err.history()[0].retry_delay, Some(Duration::from_secs(6)));
    assert!(started.elapsed() < Duration::from_millis(6_100));
    // The error still carries what the server asked for, uncapped.
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3600)));
}

#[tokio::test(start_paused = true)]
async fn retry_after_as_an_http_date() {
    let server = server().await;
    let at = std::time::SystemTime::now() + Duration::from_secs(4);
    respond_times(
        &server,
        unavailable().insert_header("retry-after", httpdate::fmt_http_date(at).as_str()),
        1,
    )
    .await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = client_with(
        &server,
        RetryPolicy::new().with_max_backoff(Duration::from_secs(10)),
    );
    let started = Instant::now();
    client.ping().await.unwrap();
    let waited = started.elapsed();
    // HTTP-dates have one-second resolution.
    assert!(
        waited > Duration::from_secs(2) && waited <= Duration::from_millis(4_500),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_in_the_past_means_no_wait() {
    let server = server().await;
    let past = std::time::SystemTime::now() - Duration::from_secs(60);
    respond_times(
        &server,
        unavailable().insert_header("retry-after", httpdate::fmt_http_date(past).as_str()),
        1,
    )
    .await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server).build().unwrap();
    let started = Instant::now();
    client.ping().await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_malformed_retry_after_falls_back_to_the_computed_backoff() {
    for junk in ["soon", "-1", "1.5", "99999999999999999999", "86401"] {
        let server = server().await;
        respond_always(
            &server,
            error(429, "RATE_LIMITED", "x").insert_header("retry-after", junk),
        )
        .await;
        let policy = RetryPolicy::new()
            .with_max_attempts(2)
            .with_throttle_initial_backoff(Duration::from_millis(300))
            .with_max_backoff(Duration::from_secs(60))
            .with_jitter(Jitter::None);
        let client = client_with(&server, policy);
        let err = client.ping().await.unwrap_err();
        assert_eq!(
            err.history()[0].retry_delay,
            Some(Duration::from_millis(300)),
            "{junk}"
        );
        assert_eq!(err.retry_after(), None, "{junk}");
    }
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_return_the_last_failure_with_its_history() {
    let server = server().await;
    respond_times(&server, error(500, "INTERNAL", "first"), 1).await;
    respond_times(&server, ResponseTemplate::new(502), 1).await;
    respond_always(&server, ResponseTemplate::new(504)).await;
    let client = builder(&server).build().unwrap();
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.status(), Some(504));
    assert_eq!(err.attempts(), 3);
    let statuses: Vec<_> = err.history().iter().map(|a| a.status).collect();
    assert_eq!(statuses, vec![Some(500), Some(502), Some(504)]);
    let delays: Vec<_> = err
        .history()
        .iter()
        .map(|a| a.retry_delay.is_some())
        .collect();
    assert_eq!(delays, vec![true, true, false]);
    assert!(err.to_string().contains("after 3 attempts"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn exhausted_on_429_the_caller_gets_rate_limited_with_the_wait() {
    let server = server().await;
    respond_always(
        &server,
        error(429, "RATE_LIMITED", "quota").insert_header("retry-after", "30"),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let err = client.ping().await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::RateLimited { .. }));
    assert_eq!(
        (err.attempts(), err.retry_after()),
        (3, Some(Duration::from_secs(30)))
    );
}

#[tokio::test(start_paused = true)]
async fn max_attempts_one_turns_retrying_off() {
    let server = server().await;
    respond_always(&server, unavailable()).await;
    let client = client_with(&server, RetryPolicy::never());
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.attempts(), 1);
    assert_eq!(attempt_headers(&server).await, vec!["1/1"]);
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_and_jitter_is_seeded() {
    let server = server().await;
    respond_always(&server, unavailable()).await;
    let no_jitter = RetryPolicy::new()
        .with_max_attempts(5)
        .with_initial_backoff(Duration::from_millis(100))
        .with_max_backoff(Duration::from_millis(300))
        .with_jitter(Jitter::None);
    let err = client_with(&server, no_jitter).ping().await.unwrap_err();
    let delays: Vec<_> = err.history().iter().filter_map(|a| a.retry_delay).collect();
    assert_eq!(delays, [100, 200, 300, 300].map(Duration::from_millis));

    let jittered = no_jitter.with_jitter(Jitter::Full).with_jitter_seed(99);
    let run = || async {
        let client = builder(&server).retry(jittered).build().unwrap();
        let err = client.ping().await.unwrap_err();
        err.history()
            .iter()
            .filter_map(|a| a.retry_delay)
            .collect::<Vec<_>>()
    };
    let (first, second) = (run().await, run().await);
    assert_eq!(first, second, "same seed, same delays");
    for (delay, cap) in first.iter().zip(&delays) {
        assert!(delay <= cap, "{delay:?} > {cap:?}");
    }
    assert_ne!(first, delays, "full jitter draws below the cap");
}

#[tokio::test(start_paused = true)]
async fn each_attempt_gets_the_full_timeout() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(&["n"], &json!([[1]])).set_delay(Duration::from_secs(5)),
    )
    .await;
    let client = builder(&server)
        .timeout(Duration::from_secs(1))
        .retry(
            RetryPolicy::new()
                .with_initial_backoff(Duration::ZERO)
                .with_max_backoff(Duration::ZERO),
        )
        .build()
        .unwrap();
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::Timeout {
            after: Duration::from_secs(1)
        }
    );
    assert!(err.is_timeout() && err.is_retryable());
    assert_eq!(err.attempts(), 3);
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn no_attempt_runs_past_max_elapsed() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(&["n"], &json!([[1]])).set_delay(Duration::from_secs(5)),
    )
    .await;
    let client = builder(&server)
        .timeout(Duration::from_secs(10))
        .retry(RetryPolicy::new().with_max_elapsed(Duration::from_millis(1_500)))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = client.ping().await.unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::Timeout {
            after: Duration::from_millis(1_500)
        }
    );
    assert_eq!(started.elapsed(), Duration::from_millis(1_500));
    assert_eq!(err.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn execute_is_never_retried_even_with_retry_writes() {
    for retry_writes in [false, true] {
        let server = server().await;
        respond_always(&server, unavailable()).await;
        let client = builder(&server).retry_writes(retry_writes).build().unwrap();
        let err = client.execute("UPDATE t SET n = n + 1").await.unwrap_err();
        assert_eq!(err.attempts(), 1);
        assert_eq!(attempt_headers(&server).await, vec!["1/1"]);
        assert!(header_values(&server, "idempotency-key").await[0].is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn writes_are_not_retried_by_default() {
    let server = server().await;
    respond_always(&server, unavailable()).await;
    let client = builder(&server).build().unwrap();
    let err = client.insert("t", &[Row { n: 1 }]).await.unwrap_err();
    assert_eq!(err.attempts(), 1);
    assert_eq!(hits(&server).await, 1);
}

#[tokio::test(start_paused = true)]
async fn retried_writes_send_the_same_idempotency_key_on_every_attempt() {
    let server = server().await;
    respond_times(&server, unavailable(), 1).await;
    respond_times(
        &server,
        error(409, "IDEMPOTENCY_KEY_IN_USE", "still running"),
        1,
    )
    .await;
    respond_always(&server, ok_effect(1, Some(1))).await;
    let client = builder(&server).retry_writes(true).build().unwrap();
    assert_eq!(client.insert("t", &[Row { n: 1 }]).await.unwrap(), 1);
    let keys = header_values(&server, "idempotency-key").await;
    assert_eq!(keys.len(), 3);
    assert!(
        !keys[0].is_empty() && keys.iter().all(|k| *k == keys[0]),
        "{keys:?}"
    );
    assert_eq!(attempt_headers(&server).await, vec!["1/3", "2/3", "3/3"]);
    // A second call gets a key of its own.
    client.insert("t", &[Row { n: 2 }]).await.unwrap();
    assert_ne!(header_values(&server, "idempotency-key").await[3], keys[0]);
}

#[tokio::test(start_paused = true)]
async fn a_write_constraint_violation_stays_final() {
    let server = server().await;
    respond_always(&server, error(409, "CONSTRAINT_VIOLATION", "UNIQUE")).await;
    let client = builder(&server).retry_writes(true).build().unwrap();
    let err = client.insert("t", &[Row { n: 1 }]).await.unwrap_err();
    assert_eq!(
        (err.attempts(), err.code()),
        (1, Some("CONSTRAINT_VIOLATION"))
    );
}

#[tokio::test(start_paused = true)]
async fn the_budget_is_shared_by_clones_and_stops_retries_when_empty() {
    let server = server().await;
    respond_always(&server, unavailable()).await;
    let budget = RetryBudget::new()
        .with_capacity(10)
        .with_retry_cost(5)
        .with_success_deposit(5);
    let client = builder(&server)
        .retry(RetryPolicy::new().with_max_attempts(5).with_jitter_seed(1))
        .retry_budget(budget)
        .build()
        .unwrap();
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.attempts(), 3, "two retries paid for, the third refused");
    assert!(err.is_budget_exhausted());
    assert!(err.to_string().contains("retry budget exhausted"), "{err}");

    let clone = client.clone();
    let err = clone.ping().await.unwrap_err();
    assert_eq!(err.attempts(), 1, "the clone shares the empty bucket");
    assert!(err.is_budget_exhausted());
    assert_eq!(hits(&server).await, 4);

    // A success deposits enough for one more retry.
    server.reset().await;
    respond_times(&server, ok_rows(&["n"], &json!([[1]])), 1).await;
    respond_always(&server, unavailable()).await;
    clone.ping().await.unwrap();
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_costs_more_of_the_budget() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(&["n"], &json!([[1]])).set_delay(Duration::from_secs(5)),
    )
    .await;
    let client = builder(&server)
        .timeout(Duration::from_secs(1))
        .retry(RetryPolicy::new().with_max_attempts(5).with_jitter_seed(1))
        .retry_budget(
            RetryBudget::new()
                .with_capacity(10)
                .with_retry_cost(5)
                .with_timeout_cost(10),
        )
        .build()
        .unwrap();
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.attempts(), 2);
    assert!(err.is_timeout() && err.is_budget_exhausted());
}

#[tokio::test(start_paused = true)]
async fn without_a_budget_retries_are_limited_by_attempts_only() {
    let server = server().await;
    respond_always(&server, unavailable()).await;
    let client = builder(&server)
        .retry(RetryPolicy::new().with_max_attempts(6).with_jitter_seed(1))
        .retry_budget(None)
        .build()
        .unwrap();
    for _ in 0..3 {
        assert_eq!(client.ping().await.unwrap_err().attempts(), 6);
    }
}

fn outcome_unknown() -> ResponseTemplate {
    error(503, "OUTCOME_UNKNOWN", "the COMMIT did not answer in time")
}

#[tokio::test(start_paused = true)]
async fn a_keyed_write_is_retried_on_outcome_unknown_under_retry_writes_with_its_key() {
    let server = server().await;
    respond_times(&server, outcome_unknown(), 1).await;
    respond_always(&server, ok_effect(1, None)).await;
    let client = builder(&server).retry_writes(true).build().unwrap();
    assert_eq!(client.insert("t", &[Row { n: 1 }]).await.unwrap(), 1);
    let keys = header_values(&server, "idempotency-key").await;
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the same key: applied at most once");
}

#[tokio::test(start_paused = true)]
async fn a_write_ending_on_outcome_unknown_says_so_whatever_came_before() {
    // Without retry_writes: one attempt.
    let server = crate::support::server().await;
    respond_always(&server, outcome_unknown()).await;
    let client = builder(&server).build().unwrap();
    let err = client.insert("t", &[Row { n: 1 }]).await.unwrap_err();
    assert!(
        err.is_outcome_unknown() && err.idempotency_key().is_some(),
        "{err:?}"
    );
    assert_eq!(hits(&server).await, 1);

    // Under retry_writes, after attempts the server answered "busy, nothing ran".
    let server = crate::support::server().await;
    respond_times(&server, unavailable(), 2).await;
    respond_always(&server, outcome_unknown()).await;
    let client = builder(&server)
        .retry(RetryPolicy::new().with_max_attempts(3).with_jitter_seed(7))
        .retry_writes(true)
        .build()
        .unwrap();
    let err = client.insert("t", &[Row { n: 1 }]).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert!(err.is_outcome_unknown(), "{err:?}");

    // Execute: never retried, outcome unknown.
    let server = crate::support::server().await;
    respond_times(&server, outcome_unknown(), 1).await;
    respond_always(&server, ok_effect(1, None)).await;
    let client = builder(&server).retry_writes(true).build().unwrap();
    let err = client.execute("UPDATE t SET n = n + 1").await.unwrap_err();
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert_eq!(hits(&server).await, 1);
}

#[tokio::test(start_paused = true)]
async fn outcome_unknown_s_retry_after_is_honoured() {
    let server = server().await;
    respond_times(
        &server,
        outcome_unknown().insert_header("retry-after", "2"),
        1,
    )
    .await;
    respond_always(&server, outcome_unknown()).await;
    let client = builder(&server)
        .retry(
            RetryPolicy::new()
                .with_max_attempts(2)
                .with_jitter(Jitter::None),
        )
        .retry_writes(true)
        .build()
        .unwrap();
    let err = client.insert("t", &[Row { n: 1 }]).await.unwrap_err();
    assert_eq!(err.history()[0].retry_delay, Some(Duration::from_secs(2)));
    assert!(err.is_outcome_unknown(), "{err:?}");
}
