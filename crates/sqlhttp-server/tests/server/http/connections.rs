//! Connections that misbehave on purpose, over real loopback TCP: clients that never read what
//! they asked for (the send timeout frees their slots), results and request ids shaped like
//! HTTP heads (the error rewriter only ever rewrites hyper's own heads, in linear time), and
//! HTTP/2 with prior knowledge (answered with GOAWAY `HTTP_1_1_REQUIRED` and the protocol's
//! JSON error).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{Config, HttpLimits, ServerHandle};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

use crate::common::{http_client, serve};

async fn sql(handle: &ServerHandle, headers: &[(&str, &str)], sql: &str) -> reqwest::Response {
    let mut request = http_client()
        .post(format!("{}/api/v1/sql", handle.url()))
        .header("content-type", "application/json")
        .body(json!({ "sql": sql }).to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

/// A connection with a tiny receive window that asks for many responses and reads none.
async fn silent_reader(handle: &ServerHandle) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(handle.local_addr()).await.unwrap();
    let requests = "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n".repeat(2_000);
    // The server stops reading once it cannot write: send what it takes, briefly.
    let _ = tokio::time::timeout(
        Duration::from_millis(200),
        stream.write_all(requests.as_bytes()),
    )
    .await;
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_lose_their_slots_after_the_send_timeout() {
    const SLOTS: usize = 20;
    let handle = serve(Config {
        http: HttpLimits {
            max_connections: SLOTS,
            send_timeout: Duration::from_secs(1),
            ..HttpLimits::default()
        },
        ..Config::default()
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..SLOTS {
        silent.push(silent_reader(&handle).await);
    }
    let started = Instant::now();
    // Every slot is held for now; within the send timeout and a margin a slot frees again,
    // although the silent clients keep their sockets open.
    let served = loop {
        let answered = http_client()
            .get(format!("{}/healthz", handle.url()))
            .send()
            .await
            .map(|response| response.status().as_u16())
            .ok();
        if answered == Some(200) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no slot freed: the silent clients still hold every connection ({answered:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("a slot freed after {served:?}");
    drop(silent);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_full_of_status_lines_is_passed_through_untouched() {
    let handle = serve(Config::default()).await;
    // 1.3 MB of `HTTP/1.1 400 `: once rescanned from every occurrence (13 s of server time).
    let reply = sql(
        &handle,
        &[],
        "SELECT replace(hex(zeroblob(100000)), '00', 'HTTP/1.1 400 ') AS t",
    )
    .await;
    assert_eq!(reply.status(), 200);
    let body: Value = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
    let text = body["rows"][0][0].as_str().unwrap();
    assert_eq!(text.len(), 1_300_000);
    assert!(text.starts_with("HTTP/1.1 400 HTTP/1.1 400 "));
    handle.shutdown().await;
}

#[tokio::test]
async fn a_request_id_shaped_like_a_status_line_is_replaced_not_spliced() {
    let handle = serve(Config::default()).await;
    for id in ["HTTP/1.1_400_x", "HTTP/1.1 400 Bad Request"] {
        let reply = sql(&handle, &[("x-request-id", id)], "SELECT 1 AS one").await;
        assert_eq!(reply.status(), 200, "{id}");
        let echoed = reply.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_ne!(echoed, id);
        assert_eq!(echoed.len(), 32, "a fresh id: {echoed}");
        let body: Value = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
        assert_eq!(body["rows"], json!([[1]]), "{id}");
    }
    handle.shutdown().await;
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_told_to_use_http1_with_the_json_error() {
    let handle = serve(Config::default()).await;
    let mut stream = TcpStream::connect(handle.local_addr()).await.unwrap();
    // The client preface and an empty SETTINGS frame.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    stream.write_all(&hello).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection")
        .unwrap();
    // SETTINGS (type 4) first, as every HTTP/2 server does, then GOAWAY (type 7).
    assert_eq!(&answer[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0], "{answer:?}");
    let goaway = &answer[9..];
    let length = usize::from(goaway[1]) << 8 | usize::from(goaway[2]);
    assert_eq!(goaway[3], 7, "a GOAWAY frame: {goaway:?}");
    assert_eq!(goaway.len(), 9 + length);
    assert_eq!(&goaway[13..17], &[0, 0, 0, 0xd], "HTTP_1_1_REQUIRED");
    let error: Value = serde_json::from_slice(&goaway[17..]).unwrap();
    assert_eq!(error["error"]["code"], "BAD_REQUEST");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HTTP/1.1"),
        "{error}"
    );

    // An HTTP/2 client gets an error at once, and HTTP/1.1 still serves.
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        h2.get(format!("{}/healthz", handle.url())).send(),
    )
    .await
    .expect("answered, not hung");
    assert!(refused.is_err(), "{refused:?}");
    let ok = http_client()
        .get(format!("{}/healthz", handle.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    handle.shutdown().await;
}
