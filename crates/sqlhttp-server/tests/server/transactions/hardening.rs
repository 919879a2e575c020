//! Interactive transactions against what a hostile or careless client does (found by a red-team
//! review; each test failed before its fix):
//!
//! - a statement re-sent under the last one's number but with another text is refused, never
//!   answered with the last one's result (the new statement would silently never run and the
//!   COMMIT would report success for work not done);
//! - without idempotency (`--no-idempotency`) no commit is recorded, so a COMMIT re-sent to
//!   another server (or after a restart) is answered "unknown", never "nothing committed";
//! - read-only transactions running long statements hold at most half the buffer budget: keyed
//!   writes and batches of other clients still run;
//! - what the registry keeps of a finished transaction is bounded in bytes (a trigger's
//!   `RAISE(ROLLBACK, ...)` message of megabytes is cut).

use std::time::Duration;

use axum::Router;
use serde_json::{Value, json};

use crate::common::{Reply, ok, post_with, send};
use crate::engines::{Engine, on_both_engines};

on_both_engines!(
    a_resent_statement_number_with_another_statement_is_not_answered_as_the_first,
    without_idempotency_a_committed_transaction_is_never_answered_as_expired,
);

async fn post(router: &Router, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(
        router,
        "POST",
        &format!("/api/v1/transaction/{path}"),
        &all,
        body.to_string(),
    )
    .await
}

async fn open(router: &Router, options: &Value) -> String {
    let reply = post(router, "open", &[], options).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()["transaction"].as_str().unwrap().to_owned()
}

async fn step(router: &Router, tx: &str, seq: u64, sql: &str) -> Reply {
    post(
        router,
        "statement",
        &[],
        &json!({ "transaction": tx, "seq": seq, "sql": sql, "params": [] }),
    )
    .await
}

async fn end(router: &Router, what: &str, tx: &str) -> Reply {
    post(router, what, &[], &json!({ "transaction": tx })).await
}

async fn a_resent_statement_number_with_another_statement_is_not_answered_as_the_first(
    engine: Engine,
) {
    let Some(router) = engine.app(|_| {}).await else {
        return;
    };
    ok(&router, "CREATE TABLE t (x INTEGER)", json!([])).await;
    let tx = open(&router, &json!({})).await;
    assert_eq!(
        step(&router, &tx, 1, "INSERT INTO t VALUES (1)")
            .await
            .status,
        200
    );
    // A client that did not move its number on: this is not a re-send of statement 1.
    let other = step(&router, &tx, 1, "INSERT INTO t VALUES (2)").await;
    let committed = end(&router, "commit", &tx).await;
    assert_eq!(committed.status, 200);
    let rows = ok(&router, "SELECT x FROM t ORDER BY x", json!([])).await["rows"].clone();
    assert_eq!(
        (other.status, other.code()),
        (422, "IDEMPOTENCY_KEY_REUSED".to_owned()),
        "{}",
        other.json()
    );
    assert!(
        other.status >= 400 || rows == json!([[1], [2]]),
        "statement 1 sent again with another text was answered {} (replayed: {:?}) and never \
         ran, yet the COMMIT reported success: the table holds {rows}",
        other.status,
        other.header("idempotent-replayed"),
    );
}

/// An open re-sent under its Idempotency-Key must ask for what the first one did.
#[tokio::test]
async fn an_open_re_sent_with_other_options_is_refused() {
    let router = crate::common::memory_app();
    let key = [("idempotency-key", "open-1")];
    let first = post(&router, "open", &key, &json!({})).await;
    assert_eq!(first.status, 200);
    let same = post(&router, "open", &key, &json!({})).await;
    assert_eq!(same.json()["transaction"], first.json()["transaction"]);
    let other = post(&router, "open", &key, &json!({ "read_only": true })).await;
    assert_eq!(
        (other.status, other.code()),
        (422, "IDEMPOTENCY_KEY_REUSED".to_owned())
    );
}

async fn without_idempotency_a_committed_transaction_is_never_answered_as_expired(engine: Engine) {
    let Some(shared) = engine.shared_database().await else {
        return;
    };
    let no_idempotency = |config: &mut sqlhttp_server::Config| config.idempotency_ttl = None;
    let first = shared.app(no_idempotency);
    // Another replica, or the first one restarted.
    let second = shared.app(no_idempotency);
    ok(&first, "CREATE TABLE t (x INTEGER)", json!([])).await;
    let tx = open(&first, &json!({})).await;
    assert_eq!(
        step(&first, &tx, 1, "INSERT INTO t VALUES (1)")
            .await
            .status,
        200
    );
    assert_eq!(end(&first, "commit", &tx).await.status, 200);
    // The client lost that answer and sends the COMMIT again, to the other server.
    let resent = end(&second, "commit", &tx).await;
    let outcome = end(&second, "outcome", &tx).await;
    assert_eq!(
        ok(&second, "SELECT count(*) FROM t", json!([])).await["rows"],
        json!([[1]]),
        "it committed"
    );
    assert_ne!(
        resent.code(),
        "TRANSACTION_EXPIRED",
        "a committed transaction's re-sent COMMIT says nothing of it was committed (the SDK's \
         `transact` then runs it again)"
    );
    assert_ne!(
        outcome.json()["outcome"],
        "expired",
        "a committed transaction's outcome is `expired`"
    );
}

/// On SQLite, sixteen read-only transactions (the default `--max-transactions`, which two
/// credentials may open, half each: see ADR 0045) each running a long statement would reserve
/// `--max-result-bytes` each, the whole default `--max-buffered-bytes`: a keyed write of
/// another client must not be refused meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_sqlite_long_transaction_statements_do_not_starve_keyed_writes() {
    let router = crate::common::app_with(&sqlhttp_server::Config {
        limits: sqlhttp_server::Limits {
            statement_timeout: Duration::from_secs(4),
            ..sqlhttp_server::Limits::default()
        },
        tokens: vec!["one".into(), "two".into()],
        ..sqlhttp_server::Config::default()
    });
    let one = [("authorization", "Bearer one")];
    post_with(&router, &one, &json!({"sql": "CREATE TABLE t (x INTEGER)"})).await;
    let slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                WHERE x < 1000000000000) SELECT count(*) FROM c";
    let mut running = Vec::new();
    for n in 0..16 {
        let auth = [(
            "authorization",
            if n % 2 == 0 {
                "Bearer one"
            } else {
                "Bearer two"
            },
        )];
        let opened = post(&router, "open", &auth, &json!({ "read_only": true })).await;
        assert_eq!(
            opened.status,
            200,
            "{}",
            String::from_utf8_lossy(&opened.body)
        );
        let tx = opened.json()["transaction"].as_str().unwrap().to_owned();
        let router = router.clone();
        running.push(tokio::spawn(async move {
            post(
                &router,
                "statement",
                &auth,
                &json!({ "transaction": tx, "seq": 1, "sql": slow, "params": [] }),
            )
            .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let keyed = post_with(
        &router,
        &[("idempotency-key", "another-client-write"), one[0]],
        &json!({ "sql": "INSERT INTO t VALUES (1)" }),
    )
    .await;
    for task in running {
        let _ = task.await;
    }
    assert_eq!(
        keyed.status,
        200,
        "a keyed write while read-only transactions ran long statements: {}",
        String::from_utf8_lossy(&keyed.body)
    );
}

/// What the registry keeps of a finished transaction is bounded: a trigger's `RAISE(ROLLBACK,
/// ..)` message of megabytes is answered whole, from memory, to every later request for it.
#[tokio::test]
async fn on_sqlite_an_aborted_transaction_keeps_a_bounded_answer() {
    let router = crate::common::memory_app();
    ok(&router, "CREATE TABLE t (x INTEGER)", json!([])).await;
    ok(
        &router,
        "CREATE TRIGGER boom BEFORE INSERT ON t BEGIN \
         SELECT RAISE(ROLLBACK, hex(zeroblob(1000000))); END",
        json!([]),
    )
    .await;
    let tx = open(&router, &json!({})).await;
    let aborted = step(&router, &tx, 1, "INSERT INTO t VALUES (1)").await;
    assert_eq!(aborted.code(), "TRANSACTION_ABORTED");
    // Later, a re-sent COMMIT is answered from what the registry kept.
    let kept = end(&router, "commit", &tx).await;
    assert_eq!(kept.code(), "TRANSACTION_ABORTED");
    assert!(
        kept.body.len() <= 64 * 1024,
        "the registry keeps {} bytes for one aborted transaction, for the idempotency TTL",
        kept.body.len()
    );
}
