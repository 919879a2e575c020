//! HTTP/2 over TLS (ALPN `h2`, ADR 0033), driven by a raw `h2` client: an idle connection is
//! closed, a stream starved of flow-control window is cut (also for its last frame), a large
//! row its client does not take is held only within the statement timeout, and the responses
//! in flight beyond each connection's first are capped (more in `http/h2_permits.rs`, ADR 0044). The
//! servers and certificates are `http/tls.rs`'s.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlhttp_server::ServerHandle;

use crate::http::tls::{certs, https, one, root, sdk};

/// An HTTP/2 client over TLS (ALPN `h2`) to `server`, trusting `dir`'s CA, whose streams start
/// with `window` bytes of flow-control window; the connection's driver runs in a task.
pub(crate) async fn h2_client(
    server: &ServerHandle,
    dir: &Path,
    window: u32,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let (send, connection) = h2_connect(server, dir, window).await;
    (send, tokio::spawn(connection))
}

type H2Connection =
    h2::client::Connection<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, bytes::Bytes>;

/// [`h2_client`]'s connection, for the caller to drive.
async fn h2_connect(
    server: &ServerHandle,
    dir: &Path,
    window: u32,
) -> (h2::client::SendRequest<bytes::Bytes>, H2Connection) {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_file(dir.join("ca.crt")).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    h2::client::Builder::new()
        .initial_window_size(window)
        .handshake(tls)
        .await
        .unwrap()
}

pub(crate) fn sql_request(url: &str, sql: &str) -> (http::Request<()>, bytes::Bytes) {
    let request = http::Request::post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    (request, json!({ "sql": sql }).to_string().into())
}

/// An HTTP/2 connection with no request running is closed after the header timeout, as an
/// idle HTTP/1.1 keep-alive is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2_connection_is_closed() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.http.header_timeout = Duration::from_millis(400);
    })
    .await;
    let (mut send, connection) = h2_client(&server, dir.path(), 65_535).await;
    let (request, body) = sql_request(&server.url(), "SELECT 1");
    let (answer, mut stream) = send.send_request(request, false).unwrap();
    stream.send_data(body, true).unwrap();
    let response = answer.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
    }
    drop(send);
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(closed.is_ok(), "the idle connection stays open");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "closed before the header timeout: {:?}",
        started.elapsed()
    );
    server.shutdown().await;
}

/// A client that gives a stream no flow-control window never lets its response out, while the
/// socket itself moves: the connection is cut after the send timeout (the statement stops with
/// it), as an HTTP/1.1 client that reads nothing is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_starved_of_window_is_cut() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.http.send_timeout = Duration::from_millis(400);
    })
    .await;
    let (mut send, connection) = h2_client(&server, dir.path(), 0).await;
    let (request, body) = sql_request(
        &server.url(),
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000) \
         SELECT i, 'padding padding padding' FROM n",
    );
    let (answer, mut stream) = send.send_request(request, false).unwrap();
    stream.send_data(body, true).unwrap();
    // The head is not flow-controlled; the body is, and the window is 0.
    let response = answer.await.unwrap();
    assert_eq!(response.status(), 200);
    let started = Instant::now();
    let cut = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(cut.is_ok(), "the starved connection stays open");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "cut before the send timeout: {:?}",
        started.elapsed()
    );
    server.shutdown().await;
}

/// A row larger than a chunk used to be queued whole and its job to end at once: a client that
/// took nothing held the row's memory, and HTTP/2 multiplies that by the streams on a connection
/// (4 connections of 128 streams of 4 MB rows: 610 MB). Its job now lasts until the client has
/// taken the row, so the statement timeout bounds how long the row is held, as for a long
/// result (ADR 0016): past it, the rest of the row is dropped and the body cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_row_its_client_does_not_take_is_held_within_the_statement_timeout() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.limits.statement_timeout = Duration::from_millis(500);
        config.http.send_timeout = Duration::from_secs(20);
    })
    .await;
    let (mut send, mut connection) = h2_connect(&server, dir.path(), 0).await;
    let (request, body) = sql_request(&server.url(), "SELECT printf('%.*c', 1000000, 'x')");
    let (answer, mut stream) = send.send_request(request, false).unwrap();
    stream.send_data(body, true).unwrap();
    let response = tokio::select! {
        response = answer => response.unwrap(),
        _ = &mut connection => panic!("the connection ended before the answer"),
    };
    assert_eq!(response.status(), 200);
    // Past the statement timeout, the client opens its window and reads.
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(1500)) => {}
        _ = &mut connection => panic!("the connection ended early"),
    }
    connection.set_initial_window_size(1 << 24).unwrap();
    let driver = tokio::spawn(connection);
    let mut body = response.into_body();
    let mut got = Vec::new();
    let mut cut = false;
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else {
            cut = true;
            break;
        };
        body.flow_control().release_capacity(chunk.len()).unwrap();
        got.extend_from_slice(&chunk);
    }
    assert!(
        cut && got.len() < 1_000_000,
        "the row waited for its client without its job ({} bytes, cut: {cut})",
        got.len()
    );
    driver.abort();
    // A client that reads gets the whole row.
    let client = reqwest::Client::builder()
        .add_root_certificate(root(dir.path()))
        .build()
        .unwrap();
    let whole = client
        .post(format!("{}/api/v1/sql", server.url()))
        .header("content-type", "application/json")
        .body(json!({ "sql": "SELECT printf('%.*c', 1000000, 'x')" }).to_string())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let whole: serde_json::Value = serde_json::from_slice(&whole).unwrap();
    assert_eq!(whole["rows"][0][0].as_str().map(str::len), Some(1_000_000));
    assert!(whole.get("error").is_none());
    server.shutdown().await;
}

/// A small answer is one frame, the body's last: hyper takes it and then waits for window, so
/// a client that opens none (here for `/healthz`, which needs no token) held its connection, and
/// its slot under `--max-connections`, for ever. It is cut after the send timeout too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_starved_of_window_for_its_last_frame_is_cut() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.http.send_timeout = Duration::from_millis(400);
    })
    .await;
    let (mut send, connection) = h2_client(&server, dir.path(), 0).await;
    let request = http::Request::get(format!("{}/healthz", server.url()))
        .body(())
        .unwrap();
    let (answer, _stream) = send.send_request(request, true).unwrap();
    let response = answer.await.unwrap();
    assert_eq!(response.status(), 200);
    let started = Instant::now();
    let cut = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(
        cut.is_ok(),
        "the connection whose last frame is starved stays open"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "cut before the send timeout: {:?}",
        started.elapsed()
    );
    server.shutdown().await;
}

/// HTTP/2 responses in flight are capped (ADR 0044): each connection's first on its own permit,
/// those beyond it on the server's shared permits (`--max-connections`, here 3), an eighth of
/// them at most (here 1) to one client address. Streams whose responses wait on a client that
/// opens no window hold the permits, a stream past them is answered 503 without running, and
/// the permits come back when the responses go.
#[tokio::test]
async fn h2_responses_in_flight_are_capped() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.http.max_connections = 3;
        config.http.send_timeout = Duration::from_secs(30);
    })
    .await;
    // Two connections, three streams that never get window: both connections' own permits and
    // the address's one shared permit are held.
    let (mut first, one_connection) = h2_client(&server, dir.path(), 0).await;
    let (mut second, two_connection) = h2_client(&server, dir.path(), 0).await;
    let mut held = Vec::new();
    for on_second in [false, false, true] {
        let send = if on_second { &mut second } else { &mut first };
        let request = http::Request::get(format!("{}/healthz", server.url()))
            .body(())
            .unwrap();
        let (answer, _) = send.send_request(request, true).unwrap();
        let response = answer.await.unwrap();
        assert_eq!(response.status(), 200);
        held.push(response);
    }
    let request = http::Request::get(format!("{}/healthz", server.url()))
        .body(())
        .unwrap();
    let (answer, _) = second.send_request(request, true).unwrap();
    let refused = answer.await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    drop(refused);
    // The starved clients go: their responses end and give their permits back.
    drop(held);
    drop((first, second));
    one_connection.abort();
    two_connection.abort();
    let client = sdk(&server.url())
        .add_root_certificate(root(dir.path()))
        .build()
        .unwrap();
    let mut last = None;
    for _ in 0..20 {
        match one(&client).await {
            Ok(n) => {
                last = None;
                assert_eq!(n, 42);
                break;
            }
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last.is_none(), "the permits came back: {last:?}");
    server.shutdown().await;
}
