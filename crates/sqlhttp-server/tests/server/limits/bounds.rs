//! Memory and disk bounded as a whole, not only per request: request bodies and whole results
//! held at once within `--max-buffered-bytes`, the write-ahead log truncated after a large write is rolled back,
//! sorts and `DISTINCT` kept in memory under `--max-engine-memory` (no temp-file spill), and
//! defaults that fit together (a value of `--max-value-bytes` can be sent).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{Config, Limits, ServerHandle};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpSocket, TcpStream};

use crate::common::{TempDb, post_json, serve};

async fn post(url: &str, body: &Value) -> (u16, Value) {
    post_json(url, "/api/v1/sql", body).await
}

/// Starts a request whose declared body is `declared` bytes, and sends a little of it.
async fn stalled_upload(handle: &ServerHandle, declared: usize) -> TcpStream {
    let mut stream = TcpStream::connect(handle.local_addr()).await.unwrap();
    let head = format!(
        "POST /api/v1/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {declared}\r\n\r\n{{\"statements\": ["
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_uploads_together_stay_within_the_buffered_budget() {
    const MIB: usize = 1 << 20;
    let handle = serve(Config {
        max_buffered_bytes: 4 * MIB,
        // The budget must hold one body with one whole result (the server checks at start).
        max_body_bytes: 2 * MIB,
        max_batch_bytes: 2 * MIB,
        limits: Limits {
            max_result_bytes: MIB,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    // Each declares 1.5 MiB: two fit the 4 MiB budget, the third does not.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        stalled.push(stalled_upload(&handle, 3 * MIB / 2).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let big = json!({"sql": "SELECT length(?)", "params": ["x".repeat(3 * MIB / 2)]});
    let (status, body) = post(&handle.url(), &big).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "UNAVAILABLE");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-buffered-bytes"),
        "{body}"
    );
    // Small requests still fit beside them, and the budget comes back when they go.
    let (status, _) = post(&handle.url(), &json!({"sql": "SELECT 1"})).await;
    assert_eq!(status, 200);
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _) = post(&handle.url(), &big).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the budget was not given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.shutdown().await;
}

#[test]
fn a_budget_that_cannot_hold_a_body_and_its_result_is_refused_at_start() {
    let config = Config {
        max_buffered_bytes: 16 * 1024 * 1024,
        ..Config::default()
    };
    let err = sqlhttp_server::AppState::new(&config).unwrap_err();
    assert!(
        matches!(
            err,
            sqlhttp_server::ServerError::BufferBudgetTooSmall { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--max-buffered-bytes"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_of_the_largest_size_can_be_sent_with_the_defaults() {
    let config = Config::default();
    let largest = config.limits.max_value_bytes;
    let handle = serve(config).await;
    use base64::Engine as _;
    let blob = base64::engine::general_purpose::STANDARD.encode(vec![7_u8; largest]);
    let (status, body) = post(
        &handle.url(),
        &json!({"sql": "SELECT length(?) AS n", "params": [{"base64": blob}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"], json!([[largest]]));
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_truncated_after_a_large_write_is_rolled_back() {
    let file = TempDb::new("wal_bound");
    let handle = serve(Config {
        database: file.database(),
        limits: Limits {
            statement_timeout: Duration::from_secs(2),
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let url = handle.url();
    let (status, _) = post(&url, &json!({"sql": "CREATE TABLE big (b BLOB)"})).await;
    assert_eq!(status, 200);
    // Far more than the statement timeout lets it write: it is interrupted and rolled back,
    // after spilling hundreds of MiB of pages into the log.
    let endless = "INSERT INTO big WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 \
                   FROM r WHERE i < 100000) SELECT zeroblob(100000) FROM r";
    let (status, body) = post(&url, &json!({ "sql": endless })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("STATEMENT_TIMEOUT"))
    );
    let mut wal = file.path().as_os_str().to_owned();
    wal.push("-wal");
    let size = || std::fs::metadata(&wal).map_or(0, |meta| meta.len());
    let deadline = Instant::now() + Duration::from_secs(10);
    while size() > 64 * 1024 * 1024 {
        assert!(
            Instant::now() < deadline,
            "the log still holds {} bytes of a rolled-back write",
            size()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = post(&url, &json!({"sql": "SELECT count(*) FROM big"})).await;
    assert_eq!((status, &body["rows"]), (200, &json!([[0]])));
    handle.shutdown().await;
}

#[tokio::test]
async fn a_distinct_larger_than_the_engine_memory_fails_clearly_instead_of_spilling() {
    // SQLite's memory limit is one per process: this runs in a process of its own. Before the
    // limit, the same query spilled its DISTINCT to temporary files and answered 200.
    let temp = tempfile::tempdir().unwrap();
    let mut command = crate::common::sqlhttpd();
    command
        .env("TMPDIR", temp.path())
        .env("SQLITE_TMPDIR", temp.path());
    command.args(["--listen", "127.0.0.1:0", "--max-engine-memory", "67108864"]);
    let mut child = command.spawn().unwrap();
    let url = crate::common::read_url(&mut child);
    let spill = "SELECT count(*) FROM (SELECT DISTINCT randomblob(100000) FROM (WITH RECURSIVE \
                 r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 5000) SELECT i FROM r))";
    let (status, body) = post(&url, &json!({ "sql": spill })).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-engine-memory"),
        "{body}"
    );
    // The server serves on.
    let (status, _) = post(&url, &json!({"sql": "SELECT 1"})).await;
    assert_eq!(status, 200);
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `batch` on a connection with a tiny receive window and never reads the answer.
async fn unread_batch(handle: &ServerHandle, batch: &Value) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(handle.local_addr()).await.unwrap();
    let body = batch.to_string();
    let request = format!(
        "POST /api/v1/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_results_nobody_reads_stay_within_the_buffered_budget() {
    const MIB: usize = 1 << 20;
    let handle = serve(Config {
        max_buffered_bytes: 32 * MIB,
        limits: Limits {
            max_result_bytes: 8 * MIB,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    // About 6.7 MB of results: five 1 MB blobs, as base64.
    let statement = json!({"sql": "SELECT zeroblob(1000000) AS b"});
    let batch = json!({"read_only": true, "statements": vec![statement; 5]});
    let mut unread = Vec::new();
    let mut refused = None;
    for _ in 0..20 {
        unread.push(unread_batch(&handle, &batch).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, answer) = post_json(&handle.url(), "/api/v1/batch", &batch).await;
        if status == 503 {
            refused = Some(answer.to_string());
            break;
        }
        assert_eq!(status, 200);
    }
    let refused = refused.expect("results nobody reads exhausted the budget before 20 of them");
    assert!(refused.contains("--max-buffered-bytes"), "{refused}");
    assert!(
        unread.len() <= 6,
        "{} unread results fit a 32 MiB budget",
        unread.len()
    );
    // Their clients leave: the budget comes back.
    drop(unread);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if post_json(&handle.url(), "/api/v1/batch", &batch).await.0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the budget was not given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.shutdown().await;
}
