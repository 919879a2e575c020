//! What an operator sees of `sqlhttpd`, against the built binary and real TCP servers: a request
//! id on every response (the client's when well-formed, else the server's, even on an answer
//! hyper writes itself) and `/metrics`, counting requests, limits, replays and timeouts.

use std::net::SocketAddr;

use sqlhttp_server::Config;

use crate::common::{http_client, serve, start};
use crate::operations::tokens_and_rate_limits::{call, stop};

#[tokio::test]
async fn every_response_carries_a_request_id() {
    let handle = serve(Config {
        tokens: vec!["tok".into()],
        ..Config::default()
    })
    .await;
    let client = http_client();
    let url = handle.url();
    let mine = call(
        &client,
        &url,
        Some("tok"),
        &[("x-request-id", "client-id-42")],
        "SELECT 1",
    )
    .await;
    assert_eq!(mine.header("x-request-id"), Some("client-id-42"));
    let long = "x".repeat(200);
    for headers in [
        &[][..],
        &[("x-request-id", "has space")][..],
        &[("x-request-id", long.as_str())][..],
    ] {
        let answer = call(&client, &url, Some("tok"), headers, "SELECT 1").await;
        let id = answer.header("x-request-id").unwrap();
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    let unauthorized = call(&client, &url, None, &[], "SELECT 1").await;
    assert_eq!(unauthorized.status, 401);
    assert!(unauthorized.header("x-request-id").is_some());
    for path in ["/healthz", "/nowhere", "/metrics"] {
        let response = client.get(format!("{url}{path}")).send().await.unwrap();
        assert!(response.headers().contains_key("x-request-id"), "{path}");
    }
    // Even an answer hyper writes itself (a malformed request) carries one.
    let raw = raw_exchange(handle.local_addr(), b"NOT HTTP\r\n\r\n").await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("x-request-id: "), "{text}");
    handle.shutdown().await;
}

async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        stream.read_to_end(&mut out),
    )
    .await;
    out
}

/// The value of one sample line of a Prometheus exposition.
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
}

#[tokio::test]
async fn metrics_count_requests_limits_replays_and_timeouts() {
    let (child, url) = start(&[
        "--listen",
        "127.0.0.1:0",
        "--rate-limit",
        "1",
        "--rate-burst",
        "10",
        "--statement-timeout",
        "100ms",
    ]);
    let client = http_client();
    let key = [("idempotency-key", "metrics-key")];
    assert_eq!(
        call(&client, &url, None, &[], "CREATE TABLE t (x)")
            .await
            .status,
        200
    );
    assert_eq!(
        call(&client, &url, None, &key, "INSERT INTO t VALUES (1)")
            .await
            .status,
        200
    );
    let replay = call(&client, &url, None, &key, "INSERT INTO t VALUES (1)").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let endless =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
    let timeout = call(&client, &url, None, &[], endless).await;
    assert_eq!(timeout.code(), "STATEMENT_TIMEOUT");
    assert_eq!(call(&client, &url, None, &[], "SELEC").await.status, 400);
    // Spend the rest of the burst (and what refilled meanwhile) until one is refused.
    let mut selects = 0.0;
    loop {
        match call(&client, &url, None, &[], "SELECT 1").await.status {
            200 => selects += 1.0,
            429 => break,
            other => panic!("{other}"),
        }
        assert!(selects < 30.0, "never limited");
    }

    let response = client.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
    );
    let text = response.text().await.unwrap();
    let expect = [
        (
            r#"sqlhttpd_requests_total{endpoint="/api/v1/sql",status="200"}"#,
            3.0 + selects,
        ),
        (
            r#"sqlhttpd_requests_total{endpoint="/api/v1/sql",status="422"}"#,
            1.0,
        ),
        (
            r#"sqlhttpd_requests_total{endpoint="/api/v1/sql",status="400"}"#,
            1.0,
        ),
        (
            r#"sqlhttpd_requests_total{endpoint="/api/v1/sql",status="429"}"#,
            1.0,
        ),
        (
            r#"sqlhttpd_request_duration_seconds_count{endpoint="/api/v1/sql"}"#,
            6.0 + selects,
        ),
        ("sqlhttpd_rate_limited_total", 1.0),
        ("sqlhttpd_idempotent_replays_total", 1.0),
        ("sqlhttpd_statement_timeouts_total", 1.0),
        (r#"sqlhttpd_engine_queue_depth{pool="writer"}"#, 0.0),
        (r#"sqlhttpd_engine_queue_depth{pool="reader"}"#, 0.0),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    let post = client.post(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(post.status(), 405);
    stop(child);
}
