//! TLS both ways (ADR 0033), with a CA and certificates each test makes
//! (`scripts/make-test-certs`, over the `openssl` command):
//!
//! - to PostgreSQL: a cluster of its own with `ssl=on` that takes TCP logins over TLS only
//!   (`scripts/start-postgres` with `START_POSTGRES_SSL`), against every `sslmode`;
//! - to clients: the SDK against `sqlhttpd` over HTTPS, on HTTP/1.1 and on HTTP/2 (ALPN),
//!   without the CA, with mutual TLS, and the certificate read again on `SIGHUP` by the binary.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlhttp::{Client, ErrorKind, RetryPolicy};
use sqlhttp_server::{AppState, Config, Server, ServerHandle, TlsFiles, app};

use crate::common::{ok, read_url, sqlhttpd};
use crate::postgres::start_cluster_with;

/// A CA and certificates for `names`, in a temporary directory (see `scripts/make-test-certs`).
fn certs(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/make-test-certs");
    let status = Command::new(script)
        .arg(dir.path())
        .args(names)
        .status()
        .unwrap();
    assert!(status.success(), "scripts/make-test-certs failed");
    dir
}

fn pem(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap()
}

fn root(dir: &Path) -> reqwest::Certificate {
    reqwest::Certificate::from_pem(&pem(dir, "ca.crt")).unwrap()
}

fn identity(dir: &Path) -> reqwest::Identity {
    reqwest::Identity::from_pem(&pem(dir, "client.pem")).unwrap()
}

/// The server starts on `url`, or says why not.
fn start_on(url: &str) -> Result<axum::Router, String> {
    let config = Config {
        database: url.parse().map_err(|e| format!("{e}"))?,
        ..Config::default()
    };
    AppState::new(&config).map(app).map_err(|e| e.to_string())
}

/// Every sslmode against a PostgreSQL that takes logins over TLS only, with a certificate for
/// `localhost` from a CA of the test's: what verifies passes (and the pool's sessions are
/// encrypted), what does not stops the start with a message that says what to change.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_follows_sslmode() {
    let ca = certs(&["localhost"]);
    let other = certs(&["localhost"]);
    let ssl_dir = ca.path().to_str().unwrap();
    let Some(cluster) = start_cluster_with(
        "trust",
        &[
            ("START_POSTGRES_SSL", ssl_dir),
            ("START_POSTGRES_SSL_ONLY", "1"),
        ],
    ) else {
        assert!(
            std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
            "cannot start a cluster with ssl=on, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
        );
        eprintln!("skipping: no PostgreSQL for scripts/start-postgres");
        return;
    };
    // postgres://postgres@127.0.0.1:PORT/postgres
    let by_ip = cluster.clone();
    let by_name = cluster.replacen("127.0.0.1", "localhost", 1);
    let ca_file = ca.path().join("ca.crt");
    let ca_file = ca_file.to_str().unwrap();
    let other_ca = other.path().join("ca.crt");
    let other_ca = other_ca.to_str().unwrap();

    let encrypted = |url: String| async move {
        let router = start_on(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let ssl = ok(
            &router,
            "SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()",
            json!([]),
        )
        .await;
        assert_eq!(ssl["rows"], json!([[true]]), "{url}");
    };
    let refused = |url: String, says: &'static [&'static str]| {
        let Err(e) = start_on(&url) else {
            panic!("{url} must not start")
        };
        for words in says {
            assert!(e.contains(words), "{url}: expected {words:?} in: {e}");
        }
    };

    encrypted(format!(
        "{by_name}?sslmode=verify-full&sslrootcert={ca_file}"
    ))
    .await;
    refused(
        format!("{by_name}?sslmode=verify-full"),
        &[
            "not signed by a CA in the built-in roots",
            "pass the CA that signed it",
        ],
    );
    refused(
        format!("{by_name}?sslmode=verify-full&sslrootcert={other_ca}"),
        &[
            "not signed by a CA in sslrootcert=",
            "pass the CA that signed it",
        ],
    );
    refused(
        format!("{by_ip}?sslmode=verify-full&sslrootcert={ca_file}"),
        &[
            "name mismatch: the certificate is for localhost, the URL's host is 127.0.0.1",
            "sslmode=verify-ca",
        ],
    );
    encrypted(format!("{by_ip}?sslmode=verify-ca&sslrootcert={ca_file}")).await;
    refused(
        format!("{by_ip}?sslmode=verify-ca&sslrootcert={other_ca}"),
        &["not signed by a CA in sslrootcert="],
    );
    encrypted(format!("{by_ip}?sslmode=require")).await;
    // libpq's rule: with a root file, `require` checks the chain too.
    refused(
        format!("{by_ip}?sslmode=require&sslrootcert={other_ca}"),
        &["not signed by a CA in sslrootcert="],
    );
    // The default is libpq's, `prefer`: TLS when offered.
    encrypted(by_ip.clone()).await;
    refused(
        format!("{by_ip}?sslmode=disable"),
        &["no encryption", "use sslmode=verify-full"],
    );
}

/// A PostgreSQL with `ssl = off` answers `N`: `require` says so, `prefer` goes on in plain text.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_without_tls_is_refused_where_tls_is_required() {
    let Some(url) = crate::postgres::database("a_postgres_without_tls").await else {
        return;
    };
    // The shared test cluster has ssl = off (scripts/start-postgres without START_POSTGRES_SSL).
    let plain = tokio_postgres::connect(&url, tokio_postgres::NoTls).await;
    let (client, connection) = plain.unwrap();
    let driver = tokio::spawn(connection);
    let ssl: String = client.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    drop(client);
    let _ = driver.await;
    if ssl == "on" {
        eprintln!("skipping: this cluster has ssl = on");
        return;
    }
    let role = crate::postgres::client_role(&url);
    let with_role = |url: String| {
        let sqlhttp_server::Database::Postgres(url) = url.parse().unwrap() else {
            panic!("PostgreSQL");
        };
        Config {
            database: sqlhttp_server::Database::Postgres(url.with_client_role(&role).unwrap()),
            ..Config::default()
        }
    };
    let e = AppState::new(&with_role(format!("{url}?sslmode=require"))).unwrap_err();
    assert!(
        e.to_string().contains(
            "PostgreSQL does not accept TLS (ssl = off), and sslmode=require asks for it"
        ),
        "{e}"
    );
    let router = app(AppState::new(&with_role(format!("{url}?sslmode=prefer"))).unwrap());
    ok(&router, "SELECT 1", json!([])).await;
}

/// Files for an in-process HTTPS server.
fn tls_files(dir: &Path, client_ca: bool) -> TlsFiles {
    TlsFiles {
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        client_ca: client_ca.then(|| dir.join("ca.crt")),
    }
}

async fn https(dir: &Path, client_ca: bool, tweak: impl FnOnce(&mut Config)) -> ServerHandle {
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls: Some(tls_files(dir, client_ca)),
        ..Config::default()
    };
    tweak(&mut config);
    Server::bind(config).await.unwrap().spawn()
}

fn sdk(url: &str) -> sqlhttp::ClientBuilder {
    Client::builder(url)
        .retry(RetryPolicy::never())
        .timeout(Duration::from_secs(10))
}

async fn one(client: &Client) -> Result<i64, sqlhttp::Error> {
    let (n,): (i64,) = client.query("SELECT 41 + 1").fetch_one().await?;
    Ok(n)
}

/// The SDK over HTTPS: HTTP/2 by ALPN by default, HTTP/1.1 when the client offers only that;
/// without the CA it gets its TLS error.
#[tokio::test]
async fn https_serves_http1_and_h2_by_alpn() {
    let dir = certs(&["localhost", "127.0.0.1"]);
    let server = https(dir.path(), false, |_| {}).await;
    let url = server.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let client = sdk(&url)
        .add_root_certificate(root(dir.path()))
        .build()
        .unwrap();
    assert_eq!(one(&client).await.unwrap(), 42);
    let http1 = reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .add_root_certificate(root(dir.path()))
        .build()
        .unwrap();
    let client = sdk(&url).http_client(http1.clone()).build().unwrap();
    assert_eq!(one(&client).await.unwrap(), 42);

    for (client, version) in [
        (http1, reqwest::Version::HTTP_11),
        (
            reqwest::Client::builder()
                .no_proxy()
                .add_root_certificate(root(dir.path()))
                .build()
                .unwrap(),
            reqwest::Version::HTTP_2,
        ),
    ] {
        let response = client
            .post(format!("{url}/api/v1/sql"))
            .header("content-type", "application/json")
            .body(r#"{"sql": "SELECT 1"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), version);
        assert_eq!(response.status(), 200);
        assert!(response.headers().contains_key("x-request-id"));
    }

    let untrusting = sdk(&url).build().unwrap();
    let e = one(&untrusting).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Tls { .. }), "{e:?}");
    server.shutdown().await;
}

/// With `--tls-client-ca`, a client without a certificate is refused and one with a
/// certificate that CA signed is served; a certificate of another CA is refused too.
#[tokio::test]
async fn mutual_tls_asks_for_a_client_certificate() {
    let dir = certs(&["127.0.0.1"]);
    let stranger = certs(&["127.0.0.1"]);
    let server = https(dir.path(), true, |_| {}).await;
    let url = server.url();

    let with = |id: Option<reqwest::Identity>| {
        let builder = sdk(&url).add_root_certificate(root(dir.path()));
        match id {
            Some(id) => builder.identity(id),
            None => builder,
        }
        .build()
        .unwrap()
    };
    assert_eq!(one(&with(Some(identity(dir.path())))).await.unwrap(), 42);
    for client in [with(None), with(Some(identity(stranger.path())))] {
        let e = one(&client).await.unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ErrorKind::Tls { .. } | ErrorKind::Connection { .. }
            ),
            "{e:?}"
        );
    }
    server.shutdown().await;
}

/// A TLS handshake that never comes is closed within the header timeout.
#[tokio::test]
async fn a_stalled_handshake_is_closed() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.http.header_timeout = Duration::from_millis(300);
    })
    .await;
    let mut stream = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0_u8; 16];
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut stream, &mut buf),
    )
    .await
    .expect("the server closes the connection");
    assert_eq!(read.unwrap_or(0), 0, "the server closes without a word");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    server.shutdown().await;
}

/// The binary, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn copy_certs(from: &Path, to: &Path) {
    for file in ["server.crt", "server.key"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
}

fn hangup(child: &Child) {
    let status = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// `SIGHUP` reads the certificate again: an open keep-alive connection goes on with the old
/// one, new connections get the new one; a file that does not load keeps the one in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate() {
    let first = certs(&["127.0.0.1"]);
    let second = certs(&["127.0.0.1"]);
    let live = tempfile::tempdir().unwrap();
    copy_certs(first.path(), live.path());
    let cert: PathBuf = live.path().join("server.crt");
    let key: PathBuf = live.path().join("server.key");
    let mut child = sqlhttpd()
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .spawn()
        .unwrap();
    let url = read_url(&mut child);
    let child = Running(child);
    assert!(url.starts_with("https://"), "{url}");

    let trusting = |dir: &Path| {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([root(dir)])
            .build()
            .unwrap();
        sdk(&url).http_client(http).build().unwrap()
    };
    let old = trusting(first.path());
    assert_eq!(one(&old).await.unwrap(), 42);

    copy_certs(second.path(), live.path());
    hangup(&child.0);
    let new = trusting(second.path());
    let deadline = Instant::now() + Duration::from_secs(10);
    while one(&new).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the new certificate is not served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The old client's open connection still works (a new one would not verify).
    assert_eq!(one(&old).await.unwrap(), 42);
    let e = one(&trusting(first.path())).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Tls { .. }), "{e:?}");

    // A key that does not load: the server keeps the second certificate.
    std::fs::write(&key, "not a key\n").unwrap();
    hangup(&child.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(one(&trusting(second.path())).await.unwrap(), 42);
}

/// A listen address other than loopback without TLS logs that tokens travel in clear.
#[test]
fn plain_http_off_loopback_warns() {
    let mut child = sqlhttpd()
        .args(["--listen", "0.0.0.0:0", "--allow-anonymous"])
        .spawn()
        .unwrap();
    let _ = read_url(&mut child);
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("bearer tokens and data travel in clear"),
        "{stderr}"
    );
}

/// An HTTP/2 client over TLS (ALPN `h2`) to `server`, trusting `dir`'s CA, whose streams start
/// with `window` bytes of flow-control window; the connection's driver runs in a task.
async fn h2_client(
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

fn sql_request(url: &str, sql: &str) -> (http::Request<()>, bytes::Bytes) {
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

/// HTTP/2 responses in flight are capped server-wide at `--max-connections`, as HTTP/1.1's are
/// by its connections: streams whose responses wait on a client that opens no window hold the
/// permits, a stream past them is answered 503 without running, and the permits come back when
/// the responses go.
#[tokio::test]
async fn h2_responses_in_flight_are_capped_server_wide() {
    let dir = certs(&["127.0.0.1"]);
    let server = https(dir.path(), false, |config| {
        config.http.max_connections = 3;
        config.http.send_timeout = Duration::from_secs(30);
    })
    .await;
    // Two connections, three streams that never get window: every permit is held.
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
