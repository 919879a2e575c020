//! Issue 36's budget findings: what requests make the server buffer, held against
//! `--max-buffered-bytes` as it really grows (a buffered job reserves a little and grows with
//! its result, so concurrent small keyed writes never take the budget by reservation alone),
//! answers shared rather than copied (a transaction's stored result and every replay of it are
//! one share), and each credential's share of transactions and their stored results.

use serde_json::json;
use tower::ServiceExt as _;

use crate::common::{ok, post_with};
use crate::engines::{Engine, engine_app, on_both_engines};

on_both_engines!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    concurrent_keyed_one_row_inserts_all_answer_under_the_default_budget,
    keyed_writes_fit_a_budget_of_one_result,
    a_keyed_result_that_outgrows_the_budget_is_refused_and_nothing_is_kept,
);

const MIB: usize = 1024 * 1024;

async fn create_table(router: &axum::Router, engine: Engine) {
    let id = engine.pick(
        "id INTEGER PRIMARY KEY",
        "id integer PRIMARY KEY GENERATED ALWAYS AS IDENTITY",
    );
    ok(router, &format!("CREATE TABLE t ({id}, v TEXT)"), json!([])).await;
}

async fn count(router: &axum::Router) -> i64 {
    ok(router, "SELECT count(*) FROM t", json!([])).await["rows"][0][0]
        .as_i64()
        .unwrap()
}

/// `n` keyed one-row inserts sent at once: each one's status and body.
async fn concurrent_keyed_inserts(router: &axum::Router, n: usize) -> Vec<(u16, String)> {
    let sent: Vec<_> = (0..n)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move {
                let key = format!("insert-{i}");
                let body =
                    json!({"sql": "INSERT INTO t (v) VALUES (?) RETURNING id", "params": [key]});
                let reply = post_with(&router, &[("idempotency-key", key.as_str())], &body).await;
                (
                    reply.status,
                    String::from_utf8_lossy(&reply.body).into_owned(),
                )
            })
        })
        .collect();
    let mut replies = Vec::new();
    for reply in sent {
        replies.push(reply.await.unwrap());
    }
    replies
}

/// Measured before the fix on PostgreSQL (a pool of 4): each job reserved `--max-result-bytes`
/// (16 MiB) of the 256 MiB budget from the moment its task started, waiting for a connection
/// included, so the 17th concurrent keyed insert of one row was `503`.
async fn concurrent_keyed_one_row_inserts_all_answer_under_the_default_budget(engine: Engine) {
    let router = engine_app!(engine);
    create_table(&router, engine).await;
    let replies = concurrent_keyed_inserts(&router, 40).await;
    let failed: Vec<_> = replies
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 40 failed: {failed:?}",
        failed.len()
    );
    assert_eq!(count(&router).await, 40);
}

/// The least budget the server starts with for results of at most 1 MiB and request bodies of
/// at most 8 KiB: one request's body and its whole result.
fn budget_of_one_result(config: &mut sqlhttp_server::Config) {
    config.limits.max_result_bytes = MIB;
    config.max_body_bytes = 8 * 1024;
    config.max_batch_bytes = 8 * 1024;
    config.max_buffered_bytes = MIB + 8 * 1024;
}

/// A budget of one result and one body: before the fix a job reserved the whole result's
/// limit when it started, so the other requests' bodies held meanwhile made one-row keyed
/// inserts `503`.
async fn keyed_writes_fit_a_budget_of_one_result(engine: Engine) {
    let router = engine_app!(engine, budget_of_one_result);
    create_table(&router, engine).await;
    let replies = concurrent_keyed_inserts(&router, 20).await;
    let failed: Vec<_> = replies
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 20 failed: {failed:?}",
        failed.len()
    );
    assert_eq!(count(&router).await, 20);
}

/// A response sent in-process and not read: its body (and its share of the budget) is held
/// until it is dropped.
async fn unread(
    router: &axum::Router,
    path: &str,
    body: &serde_json::Value,
) -> axum::response::Response {
    let request = axum::http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response
}

/// With half the budget held by an unread answer, a small keyed write still runs (before the
/// fix it could not reserve a whole result's limit: `503`), and one whose result outgrows what
/// is left is refused while it is built, before it commits: `503`, nothing written, nothing
/// stored under its key, the share given back. Once the unread answer is gone, the same key
/// runs it.
async fn a_keyed_result_that_outgrows_the_budget_is_refused_and_nothing_is_kept(engine: Engine) {
    let router = engine_app!(engine, budget_of_one_result);
    create_table(&router, engine).await;
    // 550 rows of 1,000 characters: about 560 KB of JSON.
    let rows = engine.pick(
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 550) \
         SELECT hex(zeroblob(500)) AS v FROM c",
        "SELECT repeat('x', 1000) AS v FROM generate_series(1, 550)",
    );
    let held = unread(
        &router,
        "/api/v1/batch",
        &json!({"statements": [{"sql": rows, "params": []}]}),
    )
    .await;

    let small = json!({"sql": "INSERT INTO t (v) VALUES ('one') RETURNING id", "params": []});
    let reply = post_with(&router, &[("idempotency-key", "small")], &small).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(count(&router).await, 1);

    let big = json!({"sql": format!("INSERT INTO t (v) {rows} RETURNING v"), "params": []});
    let key = [("idempotency-key", "big")];
    for _ in 0..2 {
        let reply = post_with(&router, &key, &big).await;
        assert_eq!(
            reply.status,
            503,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.code(), "UNAVAILABLE");
        assert!(reply.header("retry-after").is_some());
        assert_eq!(count(&router).await, 1, "nothing of it committed");
    }
    drop(held);
    // Nothing was stored under the key: it runs now, once.
    let reply = post_with(&router, &key, &big).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.header("idempotent-replayed"), None);
    assert_eq!(count(&router).await, 551);
}
