//! Interactive transactions against wiremock, on the paths a retry takes: a step whose outcome is
//! unknown ends the transaction (it is rolled back, never committed), and a COMMIT whose outcome is
//! unknown is settled by asking the server (`/api/v1/transaction/outcome`) before the SDK gives up.

use std::time::Duration;

use serde_json::json;
use sqlhttp::{Client, ErrorKind};
use tokio::time::Instant;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::*;

const OPEN: &str = "/api/v1/transaction/open";
const STATEMENT: &str = "/api/v1/transaction/statement";
const COMMIT: &str = "/api/v1/transaction/commit";
const ROLLBACK: &str = "/api/v1/transaction/rollback";
const OUTCOME: &str = "/api/v1/transaction/outcome";

/// Mounts `response` for every request to `route`.
async fn on(server: &MockServer, route: &str, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(response)
        .mount(server)
        .await;
}

/// Mounts `response` for the next `times` requests to `route` (in mount order).
async fn on_times(server: &MockServer, route: &str, response: ResponseTemplate, times: u64) {
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(response)
        .up_to_n_times(times)
        .mount(server)
        .await;
}

/// How many requests reached `route`.
async fn count(server: &MockServer, route: &str) -> usize {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == route)
        .count()
}

fn outcome(outcome: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({ "outcome": outcome }))
}

/// A server whose opens answer transaction `tx1` and whose rollbacks succeed.
async fn transaction_server() -> MockServer {
    let server = server().await;
    on(
        &server,
        OPEN,
        ResponseTemplate::new(200).set_body_json(json!({"transaction": "tx1"})),
    )
    .await;
    on(&server, ROLLBACK, outcome("rolled_back")).await;
    server
}

#[tokio::test(start_paused = true)]
async fn a_step_whose_outcome_is_unknown_is_rolled_back_and_never_committed() {
    let server = transaction_server().await;
    // A gateway answers every attempt of the statement 504: whether it ran is unknown.
    on(&server, STATEMENT, ResponseTemplate::new(504)).await;
    on(&server, COMMIT, outcome("committed")).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let err = tx.execute("INSERT INTO t VALUES (1)").await.unwrap_err();
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert_eq!(count(&server, STATEMENT).await, 3);
    assert_eq!(count(&server, ROLLBACK).await, 1, "rolled back at once");

    // Nothing more runs in it, and the COMMIT is never sent.
    let err = tx.execute("INSERT INTO t VALUES (2)").await.unwrap_err();
    assert!(err.is_transaction_lost(), "{err:?}");
    let err = tx.commit().await.unwrap_err();
    assert!(err.is_transaction_lost(), "{err:?}");
    assert!(!err.is_outcome_unknown() && !err.is_sent(), "{err:?}");
    assert_eq!(err.status(), None, "no response said so: {err:?}");
    assert_eq!(count(&server, COMMIT).await, 0);
    assert_eq!(count(&server, STATEMENT).await, 3);
}

#[tokio::test(start_paused = true)]
async fn a_step_refused_with_a_final_verdict_lets_the_transaction_go_on() {
    let server = transaction_server().await;
    on_times(
        &server,
        STATEMENT,
        error(
            422,
            "IDEMPOTENCY_KEY_REUSED",
            "another statement under seq 1",
        ),
        1,
    )
    .await;
    on_times(&server, STATEMENT, error(403, "READ_ONLY", "writes"), 1).await;
    on_times(&server, STATEMENT, error(400, "SQL_ERROR", "syntax"), 1).await;
    on(&server, STATEMENT, ok_effect(1, None)).await;
    on(&server, COMMIT, outcome("committed")).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    for _ in 0..3 {
        let err = tx.execute("INSERT INTO t VALUES (1)").await.unwrap_err();
        assert!(!err.is_outcome_unknown(), "{err:?}");
    }
    tx.execute("INSERT INTO t VALUES (1)").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&server, COMMIT).await, 1);
    assert_eq!(count(&server, ROLLBACK).await, 0);
}

#[tokio::test(start_paused = true)]
async fn transact_returns_a_step_s_unknown_outcome_without_committing_or_running_again() {
    let server = transaction_server().await;
    on(&server, STATEMENT, ResponseTemplate::new(504)).await;
    on(&server, COMMIT, outcome("committed")).await;
    let client = builder(&server).build().unwrap();
    let mut runs = 0;
    let err = client
        .transact(|tx| {
            runs += 1;
            async move {
                tx.execute("INSERT INTO t VALUES (1)").await?;
                Ok(())
            }
        })
        .await
        .unwrap_err();
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert_eq!(runs, 1);
    assert_eq!(count(&server, COMMIT).await, 0);
    assert_eq!(count(&server, ROLLBACK).await, 1);
}

#[tokio::test(start_paused = true)]
async fn transact_commits_as_before() {
    let server = transaction_server().await;
    on(&server, STATEMENT, ok_effect(1, None)).await;
    on(&server, COMMIT, outcome("committed")).await;
    let client = builder(&server).build().unwrap();
    let n = client
        .transact(|tx| async move {
            tx.execute("INSERT INTO t VALUES (1)").await?;
            Ok(7)
        })
        .await
        .unwrap();
    assert_eq!(n, 7);
    assert_eq!(count(&server, COMMIT).await, 1);
    assert_eq!(count(&server, OUTCOME).await, 0);
}

fn outcome_unknown() -> ResponseTemplate {
    error(
        503,
        "OUTCOME_UNKNOWN",
        "the database did not answer the COMMIT in time",
    )
}

/// A server whose transaction's one statement succeeds and whose COMMIT answers `commit`.
async fn committing_server(commit: ResponseTemplate) -> MockServer {
    let server = transaction_server().await;
    on(&server, STATEMENT, ok_effect(1, None)).await;
    on(&server, COMMIT, commit).await;
    server
}

/// Opens a transaction on `client`, runs its statement and commits it.
async fn run_and_commit(client: &Client) -> sqlhttp::Result<()> {
    let tx = client.transaction().await?;
    tx.execute("INSERT INTO t VALUES (1)").await?;
    tx.commit().await
}

#[tokio::test(start_paused = true)]
async fn a_commit_whose_outcome_is_unknown_asks_until_the_server_knows_it_committed() {
    let server = committing_server(outcome_unknown()).await;
    on_times(&server, OUTCOME, outcome("unknown"), 1).await;
    on_times(&server, OUTCOME, outcome("open"), 1).await;
    on(
        &server,
        OUTCOME,
        outcome("committed").insert_header("sqlhttp-bookmark", "00000000016b3a28"),
    )
    .await;
    let client = builder(&server).build().unwrap();
    run_and_commit(&client).await.unwrap();
    assert_eq!(
        count(&server, COMMIT).await,
        6,
        "the COMMIT was retried, and sent again when the server said the transaction was open"
    );
    assert_eq!(count(&server, OUTCOME).await, 3);
    assert_eq!(
        client.bookmark().map(|b| b.to_string()).as_deref(),
        Some("00000000016b3a28"),
        "the outcome's bookmark is the commit's"
    );
    // Every ask names the transaction.
    let asked = server.received_requests().await.unwrap();
    let bodies: Vec<serde_json::Value> = asked
        .iter()
        .filter(|r| r.url.path() == OUTCOME)
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert!(
        bodies.iter().all(|b| b == &json!({"transaction": "tx1"})),
        "{bodies:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_commit_that_never_reached_the_server_is_sent_again_when_it_says_open() {
    let server = transaction_server().await;
    on(&server, STATEMENT, ok_effect(1, None)).await;
    // A gateway answered for the server three times: no COMMIT reached it.
    on_times(&server, COMMIT, ResponseTemplate::new(504), 3).await;
    on(&server, COMMIT, outcome("committed")).await;
    on(&server, OUTCOME, outcome("open")).await;
    let client = builder(&server).build().unwrap();
    run_and_commit(&client).await.unwrap();
    assert_eq!(count(&server, OUTCOME).await, 1);
    assert_eq!(
        count(&server, COMMIT).await,
        4,
        "sent again once the server said open"
    );
}

#[tokio::test(start_paused = true)]
async fn gateway_and_server_failures_after_a_sent_commit_are_asked_too() {
    for commit in [
        ResponseTemplate::new(504),
        ResponseTemplate::new(502),
        error(500, "INTERNAL", "oops"),
    ] {
        let server = committing_server(commit).await;
        on(&server, OUTCOME, outcome("committed")).await;
        let client = builder(&server).build().unwrap();
        run_and_commit(&client).await.unwrap();
        assert_eq!(count(&server, OUTCOME).await, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_commit_found_rolled_back_is_lost_and_transact_runs_the_work_again() {
    for (said, code) in [
        ("rolled_back", "TRANSACTION_ABORTED"),
        ("aborted", "TRANSACTION_ABORTED"),
        ("expired", "TRANSACTION_EXPIRED"),
    ] {
        let server = committing_server(outcome_unknown()).await;
        on(&server, OUTCOME, outcome(said)).await;
        let client = builder(&server).build().unwrap();
        let err = run_and_commit(&client).await.unwrap_err();
        assert!(err.is_transaction_lost(), "{said}: {err:?}");
        assert!(!err.is_outcome_unknown(), "{said}: {err:?}");
        assert!(
            matches!(err.kind(), ErrorKind::TransactionLost { code: c, .. } if c == code),
            "{said}: {err:?}"
        );
    }

    // `transact` runs the work again in a new transaction, which commits.
    let server = transaction_server().await;
    on(&server, STATEMENT, ok_effect(1, None)).await;
    on_times(&server, COMMIT, outcome_unknown(), 3).await;
    on(&server, COMMIT, outcome("committed")).await;
    on(&server, OUTCOME, outcome("expired")).await;
    let client = builder(&server).build().unwrap();
    let mut runs = 0;
    client
        .transact(|tx| {
            runs += 1;
            async move {
                tx.execute("INSERT INTO t VALUES (1)").await?;
                Ok(())
            }
        })
        .await
        .unwrap();
    assert_eq!(runs, 2);
    assert_eq!(count(&server, OPEN).await, 2);
    assert_eq!(count(&server, COMMIT).await, 4);
}

/// On the real clock: a paused one would jump to the attempt's `max_elapsed` timer while a
/// request is in flight.
#[tokio::test]
async fn a_commit_still_unknown_at_max_elapsed_says_so_and_transact_does_not_run_again() {
    for answer in [
        outcome("unknown"),
        outcome("open"),
        ResponseTemplate::new(502),
    ] {
        let server = committing_server(outcome_unknown()).await;
        on(&server, OUTCOME, answer).await;
        let client = client_with(
            &server,
            quick(3).with_max_elapsed(Duration::from_millis(400)),
        );
        let tx = client.transaction().await.unwrap();
        tx.execute("INSERT INTO t VALUES (1)").await.unwrap();
        let started = Instant::now();
        let err = tx.commit().await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_millis(1_000),
            "{:?}",
            started.elapsed()
        );
        assert!(err.is_outcome_unknown(), "{err:?}");
        assert!(!err.is_transaction_lost(), "{err:?}");
        assert!(
            matches!(err.kind(), ErrorKind::OutcomeUnknown { .. }),
            "the COMMIT's error: {err:?}"
        );
        // Under a ceiling in time, asked until it (more often than the attempts allow).
        assert!(count(&server, OUTCOME).await > 3, "asked until max_elapsed");

        let mut runs = 0;
        let err = client
            .transact(|tx| {
                runs += 1;
                async move {
                    tx.execute("INSERT INTO t VALUES (1)").await?;
                    Ok(())
                }
            })
            .await
            .unwrap_err();
        assert!(err.is_outcome_unknown(), "{err:?}");
        assert_eq!(
            runs, 1,
            "never run again after a COMMIT that may have committed"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_max_elapsed_the_attempts_bound_the_asks() {
    let server = committing_server(outcome_unknown()).await;
    on(&server, OUTCOME, outcome("unknown")).await;
    let client = builder(&server).build().unwrap();
    let err = run_and_commit(&client).await.unwrap_err();
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert_eq!(count(&server, OUTCOME).await, 3);
}

#[tokio::test(start_paused = true)]
async fn a_commit_refused_before_it_ran_is_not_asked() {
    // `503 UNAVAILABLE`: busy, nothing ran.
    let server = committing_server(error(503, "UNAVAILABLE", "busy")).await;
    on(&server, OUTCOME, outcome("committed")).await;
    let client = builder(&server).build().unwrap();
    let err = run_and_commit(&client).await.unwrap_err();
    assert!(!err.is_outcome_unknown(), "{err:?}");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable { .. }),
        "{err:?}"
    );
    assert_eq!(count(&server, OUTCOME).await, 0);
}

/// On the real clock, as above.
#[tokio::test]
async fn a_cancelled_client_stops_asking() {
    let server = committing_server(outcome_unknown()).await;
    on(&server, OUTCOME, outcome("unknown")).await;
    let token = sqlhttp::CancellationToken::new();
    let client = builder(&server)
        .retry(quick(3).with_max_elapsed(Duration::from_secs(3_600)))
        .cancel_on(&token)
        .build()
        .unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO t VALUES (1)").await.unwrap();
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        token.cancel();
    };
    let started = Instant::now();
    let (err, ()) = tokio::join!(async { tx.commit().await.unwrap_err() }, cancel);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is_outcome_unknown(), "{err:?}");
    let asked = count(&server, OUTCOME).await;
    assert!(asked > 3, "{asked}");
    // Nothing more is asked once cancelled.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(count(&server, OUTCOME).await, asked);
}
