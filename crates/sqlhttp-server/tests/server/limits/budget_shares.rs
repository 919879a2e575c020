//! Issue 36's budget findings: what requests make the server buffer, held against
//! `--max-buffered-bytes` as it really grows (a buffered job reserves a little and grows with
//! its result, so concurrent small keyed writes never take the budget by reservation alone),
//! answers shared rather than copied (a transaction's stored result and every replay of it are
//! one share), and each credential's share of transactions and their stored results.

use serde_json::json;
use tower::ServiceExt as _;

use crate::common::{http_client, ok, post_with, send, start, with_writer_and_reader};
use crate::engines::{Engine, engine_app, on_both_engines};
use crate::transactions::basics::post;

on_both_engines!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    concurrent_keyed_one_row_inserts_all_answer_under_the_default_budget,
    keyed_writes_fit_a_budget_of_one_result,
    a_keyed_result_that_outgrows_the_budget_is_refused_and_nothing_is_kept,
    replays_of_a_stored_result_share_it_and_hold_it_until_sent,
    one_credential_holds_at_most_half_the_open_transactions,
    one_credential_holds_at_most_half_the_stored_results_share,
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

/// `n` keyed one-row inserts sent at once all answer `200`, and all `n` rows are there.
async fn all_keyed_inserts_answer(router: &axum::Router, n: usize) {
    let replies = concurrent_keyed_inserts(router, n).await;
    let failed: Vec<_> = replies
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {n} failed: {failed:?}",
        failed.len()
    );
    assert_eq!(count(router).await, i64::try_from(n).unwrap());
}

/// Measured before the fix on PostgreSQL (a pool of 4): each job reserved `--max-result-bytes`
/// (16 MiB) of the 256 MiB budget from the moment its task started, waiting for a connection
/// included, so the 17th concurrent keyed insert of one row was `503`.
async fn concurrent_keyed_one_row_inserts_all_answer_under_the_default_budget(engine: Engine) {
    let router = engine_app!(engine);
    create_table(&router, engine).await;
    all_keyed_inserts_answer(&router, 40).await;
}

/// The least budget the server starts with for results of at most 1 MiB and request bodies of
/// at most 8 KiB: one request's body and its whole result. On PostgreSQL a pool of 4 (the
/// default when this was measured; 8 on two cores since ADR 0065): every job that holds a
/// connection holds its slack (64 KiB), so the pool bounds what the jobs hold, and sixteen such
/// jobs would be the whole budget. With 4, 16 of the 20 requests wait for a connection: if
/// waiting reserved anything, they would not fit.
fn budget_of_one_result(config: &mut sqlhttp_server::Config) {
    config.limits.pool_size = 4;
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
    all_keyed_inserts_answer(&router, 20).await;
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
    let rows = rows_of_1000(engine, 550);
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

/// `rows` rows of 1,000 characters (550: about 560 KB of JSON).
fn rows_of_1000(engine: Engine, rows: u32) -> String {
    engine.pick(
        format!(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {rows}) \
             SELECT hex(zeroblob(500)) AS v FROM c"
        ),
        format!("SELECT repeat('x', 1000) AS v FROM generate_series(1, {rows})"),
    )
}

/// `sqlhttpd_buffered_bytes` now.
async fn buffered(router: &axum::Router) -> u64 {
    let reply = send(router, "GET", "/metrics", &[], "").await;
    let text = String::from_utf8(reply.body).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("sqlhttpd_buffered_bytes "))
        .unwrap_or_else(|| panic!("no sqlhttpd_buffered_bytes in {text}"))
        .parse()
        .unwrap()
}

/// A transaction's statement `seq` as `credential`, sent in-process and not read.
async fn step_unread(
    router: &axum::Router,
    credential: &str,
    tx: &str,
    seq: u64,
    sql: &str,
) -> axum::response::Response {
    let request = axum::http::Request::builder()
        .method("POST")
        .uri("/api/v1/transaction/statement")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {credential}"))
        .body(axum::body::Body::from(
            json!({"transaction": tx, "seq": seq, "sql": sql, "params": []}).to_string(),
        ))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response
}

/// Opens a transaction as `credential` (`read_only`): its token, or the refusal.
async fn open_as(router: &axum::Router, credential: &str) -> Result<String, crate::common::Reply> {
    let reply = post(
        router,
        "open",
        Some(credential),
        &json!({"read_only": true}),
    )
    .await;
    if reply.status == 200 {
        Ok(reply.json()["transaction"].as_str().unwrap().to_owned())
    } else {
        Err(reply)
    }
}

async fn step_as(
    router: &axum::Router,
    credential: &str,
    tx: &str,
    seq: u64,
    sql: &str,
) -> crate::common::Reply {
    post(
        router,
        "statement",
        Some(credential),
        &json!({"transaction": tx, "seq": seq, "sql": sql, "params": []}),
    )
    .await
}

async fn end_as(router: &axum::Router, credential: &str, tx: &str) {
    let reply = post(
        router,
        "rollback",
        Some(credential),
        &json!({"transaction": tx}),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
}

/// Forty replays of a stored result, none of them read, are one share of the budget, not
/// forty copies outside it: the share is held while any answer is unsent (after the
/// transaction ended too) and given back once the last is gone. Before the fix each replay
/// copied the body outside the budget (40 unread replays of 6 MB: +248 MiB under a 32 MiB
/// budget), and the share went with the transaction while its answers were still unsent.
async fn replays_of_a_stored_result_share_it_and_hold_it_until_sent(engine: Engine) {
    let router = engine_app!(engine, |config| {
        with_writer_and_reader(config);
        config.limits.pool_size = 8;
    });
    let idle = buffered(&router).await;
    let tx = open_as(&router, "writer").await.unwrap();
    let big = rows_of_1000(engine, 3000);
    let first = step_unread(&router, "writer", &tx, 1, &big).await;
    let mut unread = vec![first];
    for _ in 0..40 {
        unread.push(step_unread(&router, "writer", &tx, 1, &big).await);
    }
    let held = buffered(&router).await - idle;
    assert!(
        (3_000_000..6_000_000).contains(&held),
        "41 unread answers of a 3 MB result hold one share: {held} bytes"
    );
    end_as(&router, "writer", &tx).await;
    let after_rollback = buffered(&router).await - idle;
    assert!(
        after_rollback >= 3_000_000,
        "unsent answers still hold their share: {after_rollback} bytes"
    );
    // Every answer is the whole result, the same bytes.
    let last = unread.pop().unwrap();
    assert_eq!(last.headers().get("idempotent-replayed").unwrap(), "true");
    let replayed = axum::body::to_bytes(last.into_body(), usize::MAX)
        .await
        .unwrap();
    let fresh = axum::body::to_bytes(unread.remove(0).into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(fresh.len() > 3_000_000);
    assert_eq!(replayed, fresh);
    drop(unread);
    assert!(
        buffered(&router).await - idle < 64 * 1024,
        "the share went with the last answer"
    );
}

/// One credential may hold at most half of `--max-transactions` open (here 2 of 4), so
/// another one always can open its own. Before the fix a write token could open all of them,
/// and every other credential's open was `503` until it let go.
async fn one_credential_holds_at_most_half_the_open_transactions(engine: Engine) {
    let router = engine_app!(engine, |config| {
        with_writer_and_reader(config);
        config.transactions.max_open = 4;
        config.limits.pool_size = 8;
    });
    let mut writers = Vec::new();
    for _ in 0..2 {
        writers.push(open_as(&router, "writer").await.unwrap());
    }
    let refused = open_as(&router, "writer").await.unwrap_err();
    assert_eq!(
        refused.status,
        503,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert!(refused.header("retry-after").is_some());
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this credential holds as many open transactions")
    );
    let readers = [
        open_as(&router, "reader").await.unwrap(),
        open_as(&router, "reader").await.unwrap(),
    ];
    // Each keeps to its half; one that ends one may open another.
    assert_eq!(open_as(&router, "reader").await.unwrap_err().status, 503);
    end_as(&router, "writer", &writers.pop().unwrap()).await;
    writers.push(open_as(&router, "writer").await.unwrap());
    for tx in &writers {
        end_as(&router, "writer", tx).await;
    }
    for tx in &readers {
        end_as(&router, "reader", tx).await;
    }
}

/// One credential's stored results (and their unsent answers) may hold at most half of what
/// transactions may hold of the budget (here 1 MiB of 2 MiB): with 560 KB of it held, its next
/// statement, which reserves a whole result's limit, is `503` and not run, while another
/// credential's runs. Before the fix the part transactions may hold was one pool.
async fn one_credential_holds_at_most_half_the_stored_results_share(engine: Engine) {
    let router = engine_app!(engine, |config| {
        with_writer_and_reader(config);
        config.limits.max_result_bytes = MIB;
        config.max_body_bytes = 8 * 1024;
        config.max_batch_bytes = 8 * 1024;
        config.max_buffered_bytes = 4 * MIB;
        config.limits.pool_size = 8;
    });
    let a = open_as(&router, "writer").await.unwrap();
    let b = open_as(&router, "writer").await.unwrap();
    let c = open_as(&router, "reader").await.unwrap();
    let big = step_as(&router, "writer", &a, 1, &rows_of_1000(engine, 550)).await;
    assert_eq!(big.status, 200, "{}", String::from_utf8_lossy(&big.body));

    let refused = step_as(&router, "writer", &b, 1, "SELECT 1").await;
    assert_eq!(
        refused.status,
        503,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this credential's open transactions hold as much memory")
    );
    let other = step_as(&router, "reader", &c, 1, "SELECT 1").await;
    assert_eq!(
        other.status,
        200,
        "{}",
        String::from_utf8_lossy(&other.body)
    );

    // Statement 1 of `b` did not run: once `a` ends, it runs.
    end_as(&router, "writer", &a).await;
    let ran = step_as(&router, "writer", &b, 1, "SELECT 1").await;
    assert_eq!(ran.status, 200, "{}", String::from_utf8_lossy(&ran.body));
    assert_eq!(ran.header("idempotent-replayed"), None);
    end_as(&router, "writer", &b).await;
    end_as(&router, "reader", &c).await;
}

/// The measurement, on the binary: a 6 MB stored result replayed to 40 connections
/// that never read, under `--max-buffered-bytes 32MiB`. Before the fix the server grew by
/// 248 MiB (a copy per replay); now the replays share the one result (the bound is generous:
/// socket buffers, allocator slack).
#[tokio::test]
async fn forty_unread_replays_of_a_large_result_do_not_grow_the_server() {
    use std::io::Write as _;
    let (mut child, url) = start(&[
        "--listen",
        "127.0.0.1:0",
        "--max-buffered-bytes",
        &(32 * MIB).to_string(),
    ]);
    let client = http_client();
    let post = |path: &str, body: serde_json::Value| {
        client
            .post(format!("{url}/api/v1/transaction/{path}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let opened = post("open", json!({"read_only": true}))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let opened: serde_json::Value = serde_json::from_slice(&opened).unwrap();
    let tx = opened["transaction"].as_str().unwrap().to_owned();
    let step = json!({"transaction": tx, "seq": 1, "sql": rows_of_1000(Engine::Sqlite, 6000),
                      "params": []});
    let first = post("statement", step.clone()).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.bytes().await.unwrap().len() > 6_000_000);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = crate::common::rss_of(child.id());

    let addr = url.strip_prefix("http://").unwrap().to_owned();
    let body = step.to_string();
    let request = format!(
        "POST /api/v1/transaction/statement HTTP/1.1\r\nhost: {addr}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let unread: Vec<std::net::TcpStream> = (0..40)
        .map(|_| {
            let mut socket = std::net::TcpStream::connect(&addr).unwrap();
            socket.write_all(request.as_bytes()).unwrap();
            socket
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let after = crate::common::rss_of(child.id());
    let grew = after.saturating_sub(before);
    eprintln!(
        "40 unread replays of a 6 MB result: RSS {} -> {} MiB (+{} MiB)",
        before / (1 << 20),
        after / (1 << 20),
        grew / (1 << 20)
    );
    drop(unread);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(before > 0, "no /proc/{{pid}}/status");
    assert!(
        grew < 64 * MIB as u64,
        "40 unread replays grew the server by {} MiB",
        grew / (1 << 20)
    );
}
