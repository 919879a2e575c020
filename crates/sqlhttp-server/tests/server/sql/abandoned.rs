//! Streams their clients abandon half-way never harm the next request: the statement is
//! stopped, and on PostgreSQL the session it was cancelled on is closed rather than pooled, since
//! PostgreSQL may deliver a cancel after the statement it was meant for, to the next one. Run
//! on both engines (see [`crate::engines`]), on one connection so each next request lands on the
//! session the abandoned one used; and a write stopped mid-stream, on SQLite.

use serde_json::{Value, json};
use sqlhttp_server::{Config, Limits, ServerHandle};

use crate::common::{http_client, serve};
use crate::engines::{Engine, on_both_engines};

on_both_engines!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    the_request_after_an_abandoned_stream_is_answered_as_if_alone,
);

async fn post(handle: &ServerHandle, sql: &str, params: Value) -> reqwest::Response {
    http_client()
        .post(format!("{}/api/v1/sql", handle.url()))
        .header("content-type", "application/json")
        .body(json!({"sql": sql, "params": params}).to_string())
        .send()
        .await
        .unwrap()
}

/// 150 times: a stream of a 20 000-row table abandoned after its first chunk, then a lookup that
/// must be answered as if alone.
async fn the_request_after_an_abandoned_stream_is_answered_as_if_alone(engine: Engine) {
    let Some(config) = engine.config().await else {
        return;
    };
    let handle = serve(Config {
        limits: Limits {
            read_connections: 0,
            pool_size: 1,
            ..Limits::default()
        },
        ..config
    })
    .await;
    // SQLite has no generate_series by default: the table is made with a recursive query.
    let big = engine.pick(
        "CREATE TABLE big AS WITH RECURSIVE g(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM g \
         WHERE id < 20000) SELECT id, printf('%200s', 'x') AS pad FROM g",
        "CREATE TABLE big AS SELECT g AS id, repeat('x', 200) AS pad FROM \
         generate_series(1, 20000) AS g",
    );
    let made = post(&handle, big, json!([])).await;
    assert_eq!(
        made.status(),
        200,
        "{engine:?}: {}",
        made.text().await.unwrap()
    );
    let mut failures = Vec::new();
    for round in 0..150 {
        let mut stream = post(&handle, "SELECT id, pad FROM big ORDER BY id", json!([])).await;
        assert_eq!(stream.status(), 200);
        // One chunk, then the client goes.
        let _ = stream.chunk().await;
        drop(stream);
        let read = post(
            &handle,
            "SELECT id FROM big WHERE id = ?",
            json!([round + 1]),
        )
        .await;
        let status = read.status();
        let body = read.text().await.unwrap();
        if status != 200 || !body.contains(&format!("[[{}]]", round + 1)) {
            failures.push(format!("round {round}: {status} {body}"));
        }
    }
    assert!(failures.is_empty(), "{engine:?}: {failures:#?}");
    handle.shutdown().await;
}

/// A `RETURNING` write whose streamed answer is stopped half-way (its client reads too slowly
/// for the statement timeout, or leaves) is rolled back, as the error in its body says. SQLite's
/// (a file database): it needs no PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stopped_mid_stream_is_not_kept() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let file = crate::common::TempDb::new("stopped_write");
    let handle = serve(Config {
        database: file.database(),
        limits: Limits {
            statement_timeout: std::time::Duration::from_secs(2),
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let made = post(&handle, "CREATE TABLE t (x INTEGER)", json!([])).await;
    assert_eq!(made.status(), 200);
    let write = "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                 WHERE x < 100000) SELECT x FROM c RETURNING x, printf('%1000d', x) AS pad";
    let body = json!({ "sql": write }).to_string();
    let request = format!(
        "POST /api/v1/sql HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    for leave in [false, true] {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(handle.local_addr()).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut first = vec![0_u8; 4096];
        let n = stream.read(&mut first).await.unwrap();
        let head = String::from_utf8_lossy(&first[..n]).into_owned();
        assert!(head.starts_with("HTTP/1.1 200"), "{leave}: {head}");
        // Past the statement timeout, while the statement waits for this client to read.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        if leave {
            drop(stream);
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        } else {
            let mut rest = Vec::new();
            stream.read_to_end(&mut rest).await.unwrap();
            let tail =
                String::from_utf8_lossy(&rest[rest.len().saturating_sub(400)..]).into_owned();
            assert!(tail.contains("STATEMENT_TIMEOUT"), "{tail}");
        }
        let count = post(&handle, "SELECT count(*) FROM t", json!([])).await;
        let count: Value = serde_json::from_slice(&count.bytes().await.unwrap()).unwrap();
        assert_eq!(
            count["rows"],
            json!([[0]]),
            "left: {leave}: the stopped write was kept"
        );
    }
    handle.shutdown().await;
}
