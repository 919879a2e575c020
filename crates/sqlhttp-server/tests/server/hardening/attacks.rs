//! The server under attack and under load, through real sockets: requests that used to crash
//! it, escape the database, reach the server's own tables, run forever or exhaust memory; slow
//! and hostile HTTP clients; browsers; reads beside a long report.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{Config, HttpLimits, Limits, ServerHandle};

use crate::common::{http_client, post_over_http, serve, start as start_binary};

const ENDLESS: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

async fn post_to(
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let (status, headers, bytes) =
        post_over_http(&http_client(), url, "/api/v1/sql", headers, body).await;
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    (status, headers, json)
}

async fn sql(handle: &ServerHandle, text: &str) -> (u16, Value) {
    let (status, _, body) = post_to(&handle.url(), &[], &json!({ "sql": text })).await;
    (status, body)
}

/// A child process killed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends raw bytes and reads until the server closes the connection (or `within` passes), on
/// a blocking thread so the server keeps running on the test's runtime.
async fn raw_exchange(handle: &ServerHandle, request: &[u8], within: Duration) -> Vec<u8> {
    let addr = handle.local_addr();
    let request = request.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(within)).unwrap();
        let _ = stream.write_all(&request);
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        response
    })
    .await
    .unwrap()
}

fn json_body_of(response: &[u8]) -> Value {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete response: {text:?}"));
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

#[tokio::test]
async fn a_flood_of_statements_or_nesting_cannot_end_the_process() {
    let (child, url) = start_binary(&["--listen", "127.0.0.1:0"]);
    // Killed however the test ends, so a failure leaves no server behind.
    let mut child = KillOnDrop(child);
    let floods = [
        "END;".repeat(9_000),
        "SELECT 1;".repeat(4_000),
        ";".repeat(200_000),
        format!("SELECT {}1{}", "(".repeat(100_000), ")".repeat(100_000)),
        format!("SELECT {}", "-1+".repeat(60_000) + "1"),
        "/* unterminated".repeat(10_000),
        format!("SELECT '{}", "x".repeat(200_000)),
        format!("SELECT {} FROM t", "CASE WHEN 1 THEN ".repeat(20_000)),
    ];
    for flood in &floods {
        let (status, _, body) = post_to(&url, &[], &json!({ "sql": flood })).await;
        assert!(
            (400..500).contains(&status),
            "{status} {} for {}...",
            body["error"],
            &flood[..40]
        );
        assert!(body["error"]["code"].is_string(), "{body}");
    }
    let (status, _, body) = post_to(&url, &[], &json!({"sql": "SELECT 42"})).await;
    assert_eq!((status, &body["rows"]), (200, &json!([[42]])));
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the process is alive"
    );
}

#[tokio::test]
async fn statements_reach_the_served_database_and_nothing_else() {
    let handle = serve(Config::default()).await;
    let outside = tempfile::tempdir().unwrap();
    let attached = outside.path().join("attached.db");
    let copy = outside.path().join("copy.db");
    let attach = format!("ATTACH '{}' AS other", attached.display());
    let vacuum = format!("VACUUM INTO '{}'", copy.display());
    sql(&handle, "CREATE TABLE parent (id INTEGER PRIMARY KEY)").await;
    sql(
        &handle,
        "CREATE TABLE child (p INTEGER REFERENCES parent(id))",
    )
    .await;
    for refused in [
        attach.as_str(),
        "DETACH other",
        vacuum.as_str(),
        "VACUUM",
        "PRAGMA foreign_keys = OFF",
        "PRAGMA journal_mode = DELETE",
        "PRAGMA synchronous = OFF",
        "PRAGMA writable_schema = ON",
        "PRAGMA user_version = 3",
        "PRAGMA database_list",
        "SELECT file FROM pragma_database_list",
        "SELECT load_extension('libevil')",
        "CREATE TEMP TABLE scratch (x)",
    ] {
        let (status, body) = sql(&handle, refused).await;
        assert_eq!(status, 403, "{refused}: {body}");
        assert_eq!(body["error"]["code"], "STATEMENT_NOT_ALLOWED", "{refused}");
    }
    assert!(!attached.exists(), "ATTACH created no file");
    assert!(!copy.exists(), "VACUUM INTO wrote no copy");
    for allowed in [
        "PRAGMA table_info(child)",
        "PRAGMA foreign_key_list(child)",
        "PRAGMA index_list(parent)",
        "PRAGMA user_version",
        "SELECT name FROM pragma_table_info('parent')",
    ] {
        let (status, body) = sql(&handle, allowed).await;
        assert_eq!(status, 200, "{allowed}: {body}");
    }
    // The settings can be read, and they are the server's.
    for (setting, value) in [("journal_mode", json!("wal")), ("foreign_keys", json!(1))] {
        let (status, body) = sql(&handle, &format!("PRAGMA {setting}")).await;
        assert_eq!(
            (status, &body["rows"]),
            (200, &json!([[value]])),
            "{setting}"
        );
    }
    // Foreign keys are still the server's: on.
    let (status, body) = sql(&handle, "INSERT INTO child VALUES (7)").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["constraint"], "foreign_key");
    handle.shutdown().await;
}

#[tokio::test]
async fn a_runaway_statement_times_out_and_the_server_answers_on() {
    let handle = serve(Config {
        limits: Limits {
            statement_timeout: Duration::from_millis(200),
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    sql(&handle, "CREATE TABLE t (x)").await;
    let endless_insert = "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";
    for statement in [ENDLESS, endless_insert] {
        let (status, body) = sql(&handle, statement).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "STATEMENT_TIMEOUT");
    }
    let (_, count) = sql(&handle, "SELECT count(*) FROM t").await;
    assert_eq!(
        count["rows"],
        json!([[0]]),
        "the interrupted insert left nothing"
    );
    let ready = http_client()
        .get(format!("{}/readyz", handle.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    handle.shutdown().await;
}

#[tokio::test]
async fn a_client_that_goes_away_stops_its_statement() {
    let handle = serve(Config {
        limits: Limits {
            read_connections: 1,
            statement_timeout: Duration::from_secs(120),
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    sql(&handle, "CREATE TABLE t (x)").await;
    let endless_insert = "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";
    for statement in [ENDLESS, endless_insert] {
        let abandoned = tokio::time::timeout(
            Duration::from_millis(300),
            post_to(&handle.url(), &[], &json!({ "sql": statement })),
        )
        .await;
        assert!(abandoned.is_err(), "the statement was still running");
    }
    // The only reader and the writer are free again long before the statement timeout.
    let (status, count) = tokio::time::timeout(
        Duration::from_secs(10),
        sql(&handle, "SELECT count(*) FROM t"),
    )
    .await
    .expect("both connections were released");
    assert_eq!(status, 200);
    assert_eq!(
        count["rows"],
        json!([[0]]),
        "the abandoned insert was rolled back"
    );
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(10),
        sql(&handle, "INSERT INTO t VALUES (1)"),
    )
    .await
    .expect("the writer was released");
    assert_eq!(status, 200);
    handle.shutdown().await;
}

#[tokio::test]
async fn quick_lookups_are_not_queued_behind_a_long_report() {
    let handle = serve(Config {
        limits: Limits {
            statement_timeout: Duration::from_secs(30),
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    sql(&handle, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)").await;
    let url = handle.url();
    let report = tokio::spawn(async move { post_to(&url, &[], &json!({ "sql": ENDLESS })).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for id in 0..20 {
        let (status, _) = sql(&handle, &format!("INSERT INTO t VALUES ({id}, 'v')")).await;
        assert_eq!(status, 200);
        let (status, row) = sql(&handle, &format!("SELECT v FROM t WHERE id = {id}")).await;
        assert_eq!((status, &row["rows"]), (200, &json!([["v"]])));
    }
    assert!(
        !report.is_finished(),
        "the report is still running beside them"
    );
    report.abort();
    handle.shutdown().await;
}

#[tokio::test]
async fn values_and_results_are_bounded() {
    let handle = serve(Config {
        limits: Limits {
            max_result_bytes: 1 << 20,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let (status, body) = sql(&handle, "SELECT zeroblob(300000000)").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-value-bytes")
    );
    // A result larger than the buffered limit streams...
    let (status, body) = sql(
        &handle,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) SELECT x, 'row' FROM c",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["rows"].as_array().unwrap().len(), 100_000);
    // ...but a keyed write's outcome is stored for replay, so it is bounded.
    let (status, _) = sql(&handle, "CREATE TABLE big (x INTEGER)").await;
    assert_eq!(status, 200);
    let (status, _, body) = post_to(
        &handle.url(),
        &[("idempotency-key", "big-returning")],
        &json!({"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) INSERT INTO big SELECT x FROM c RETURNING x, 'row'"}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "RESULT_TOO_LARGE");
    let (_, count) = sql(&handle, "SELECT count(*) FROM big").await;
    assert_eq!(
        count["rows"],
        json!([[0]]),
        "the refused write was rolled back"
    );
    let (status, _) = sql(&handle, "SELECT 1").await;
    assert_eq!(status, 200);
    handle.shutdown().await;
}

#[tokio::test]
async fn browsers_need_a_listed_origin() {
    let closed = serve(Config::default()).await;
    let (status, _, body) = post_to(
        &closed.url(),
        &[("origin", "https://evil.example")],
        &json!({"sql": "SELECT 1"}),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(body["error"]["code"], "ORIGIN_NOT_ALLOWED");
    closed.shutdown().await;

    let open = serve(Config {
        http: HttpLimits {
            allow_origins: vec!["https://app.example".into()],
            ..HttpLimits::default()
        },
        ..Config::default()
    })
    .await;
    let (status, headers, _) = post_to(
        &open.url(),
        &[("origin", "https://app.example")],
        &json!({"sql": "SELECT 1"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let preflight = http_client()
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/api/v1/sql", open.url()),
        )
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type, authorization",
        )
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "{}", preflight.status());
    assert_eq!(
        preflight.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let (status, _, _) = post_to(
        &open.url(),
        &[("origin", "https://other.example")],
        &json!({"sql": "SELECT 1"}),
    )
    .await;
    assert_eq!(status, 403);
    open.shutdown().await;
}

#[tokio::test]
async fn slow_and_malformed_http_gets_json_errors_and_closed_connections() {
    let handle = serve(Config {
        http: HttpLimits {
            header_timeout: Duration::from_millis(300),
            body_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        },
        ..Config::default()
    })
    .await;

    // A head that never completes: closed by the server, well before the test gives up.
    let started = Instant::now();
    let nothing = raw_exchange(
        &handle,
        b"POST /api/v1/sql HTTP/1.1\r\nHost: x\r\n",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "held {:?}",
        started.elapsed()
    );
    assert!(
        nothing.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&nothing)
    );

    // A body that never completes: 408 with the protocol's body.
    let slow_body = raw_exchange(
        &handle,
        b"POST /api/v1/sql HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"sql\":",
        Duration::from_secs(10),
    ).await;
    assert!(
        slow_body.starts_with(b"HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&slow_body)
    );
    assert_eq!(json_body_of(&slow_body)["error"]["code"], "REQUEST_TIMEOUT");

    // Too many headers and garbage: hyper's own answers, with the protocol's body.
    let mut crowded = b"POST /api/v1/sql HTTP/1.1\r\nHost: x\r\n".to_vec();
    for n in 0..200 {
        crowded.extend_from_slice(format!("x-filler-{n}: a\r\n").as_bytes());
    }
    crowded.extend_from_slice(b"\r\n");
    let too_large = raw_exchange(&handle, &crowded, Duration::from_secs(10)).await;
    assert!(
        too_large.starts_with(b"HTTP/1.1 431"),
        "{:?}",
        String::from_utf8_lossy(&too_large[..too_large.len().min(200)])
    );
    assert_eq!(
        json_body_of(&too_large)["error"]["code"],
        "HEADERS_TOO_LARGE"
    );
    // One huge header, most of it still in flight when the server answers: the answer arrives.
    let mut huge = b"POST /api/v1/sql HTTP/1.1\r\nHost: x\r\nx-filler: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 1 << 20));
    huge.extend_from_slice(b"\r\n\r\n");
    let too_large = raw_exchange(&handle, &huge, Duration::from_secs(10)).await;
    assert!(
        too_large.starts_with(b"HTTP/1.1 431"),
        "{:?}",
        String::from_utf8_lossy(&too_large[..too_large.len().min(200)])
    );
    assert_eq!(
        json_body_of(&too_large)["error"]["code"],
        "HEADERS_TOO_LARGE"
    );
    let garbage = raw_exchange(&handle, b"NOT HTTP AT ALL\r\n\r\n", Duration::from_secs(10)).await;
    assert!(
        garbage.starts_with(b"HTTP/1.1 400"),
        "{:?}",
        String::from_utf8_lossy(&garbage)
    );
    assert_eq!(json_body_of(&garbage)["error"]["code"], "BAD_REQUEST");
    handle.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_cap_get_503() {
    let handle = serve(Config {
        http: HttpLimits {
            max_connections: 2,
            ..HttpLimits::default()
        },
        ..Config::default()
    })
    .await;
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(handle.local_addr()).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = raw_exchange(
        &handle,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        refused.starts_with(b"HTTP/1.1 503"),
        "{:?}",
        String::from_utf8_lossy(&refused)
    );
    assert_eq!(json_body_of(&refused)["error"]["code"], "UNAVAILABLE");
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = sql(&handle, "SELECT 1").await;
    assert_eq!(status, 200);
    handle.shutdown().await;
}
