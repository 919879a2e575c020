//! `sqlhttpd --otlp-endpoint`: the built binary exports its spans over OTLP/HTTP (protobuf) to a
//! small real receiver in the test (an axum endpoint that takes `POST /v1/traces`), and the
//! spans of a request that carried `traceparent` are in the caller's trace. Off by default: a
//! server without the flag sends nothing.
//!
//! Knows the binary's flags, the OTLP/HTTP path and that a protobuf span holds its trace id as
//! its 16 raw bytes; nothing about the server's insides.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;

use crate::common::{http_client, read_url, sqlhttpd};

const TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4737";

/// What the receiver was sent: each `POST /v1/traces` body.
type Received = Arc<Mutex<Vec<Bytes>>>;

/// An OTLP/HTTP traces receiver on a free port: its base URL and what it receives.
async fn receiver() -> (String, Received) {
    let received = Received::default();
    let app = Router::new()
        .route(
            "/v1/traces",
            post(|State(received): State<Received>, body: Bytes| async move {
                received.lock().unwrap().push(body);
                // An empty ExportTraceServiceResponse.
                ([("content-type", "application/x-protobuf")], Bytes::new())
            }),
        )
        .with_state(Arc::clone(&received));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

fn trace_bytes() -> Vec<u8> {
    (0..16)
        .map(|i| u8::from_str_radix(&TRACE[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

async fn traced_request(url: &str) {
    let answer = http_client()
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{TRACE}-00f067aa0ba902b7-01"))
        .body(r#"{"sql": "SELECT 1"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_in_the_caller_s_trace() {
    let (endpoint, received) = receiver().await;
    let mut child = sqlhttpd()
        .args(["--listen", "127.0.0.1:0", "--otlp-endpoint", &endpoint])
        // Batches go out every 100 ms instead of every 5 s (the standard variable).
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .spawn()
        .unwrap();
    let url = read_url(&mut child);
    traced_request(&url).await;
    let trace = trace_bytes();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let found = received
            .lock()
            .unwrap()
            .iter()
            .any(|body| body.windows(16).any(|window| window == trace.as_slice()));
        if found {
            break;
        }
        assert!(
            Instant::now() < until,
            "no span of trace {TRACE} reached the receiver ({} exports)",
            received.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = received.lock().unwrap().concat();
    for name in [&b"request"[..], b"admission", b"engine", b"sqlhttpd"] {
        assert!(
            body.windows(name.len()).any(|window| window == name),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();

    // Without the flag (and without the standard variables), nothing is exported.
    let before = received.lock().unwrap().len();
    let mut quiet = sqlhttpd()
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .spawn()
        .unwrap();
    let url = read_url(&mut quiet);
    traced_request(&url).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    quiet.kill().unwrap();
    quiet.wait().unwrap();
    assert_eq!(received.lock().unwrap().len(), before);
}

#[test]
fn a_bad_endpoint_is_refused_at_start() {
    let out = sqlhttpd()
        .args([
            "--listen",
            "127.0.0.1:0",
            "--otlp-endpoint",
            "collector:4318",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--otlp-endpoint"), "{stderr}");
}
