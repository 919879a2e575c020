//! TLS to clients (ADR 0033), with a CA and certificates each test makes
//! (`scripts/make-test-certs`, over the `openssl` command): the SDK against `sqlhttpd` over
//! HTTPS, on HTTP/1.1 and on HTTP/2 (ALPN), without the CA, with mutual TLS, a stalled
//! handshake, the certificate read again on `SIGHUP` by the binary, and the warning for plain
//! HTTP off loopback. HTTP/2's own bounds over TLS are `http/https_h2.rs`; TLS to PostgreSQL is
//! `postgres/tls.rs`. Both use this file's helpers.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use sqlhttp::{Client, ErrorKind, RetryPolicy};
use sqlhttp_server::{Config, Server, ServerHandle, TlsFiles};

use crate::common::{read_url, sqlhttpd};

/// A CA and certificates for `names`, in a temporary directory (see `scripts/make-test-certs`).
pub(crate) fn certs(names: &[&str]) -> tempfile::TempDir {
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

/// The test CA of `dir`, for a client to trust.
pub(crate) fn root(dir: &Path) -> reqwest::Certificate {
    reqwest::Certificate::from_pem(&pem(dir, "ca.crt")).unwrap()
}

fn identity(dir: &Path) -> reqwest::Identity {
    reqwest::Identity::from_pem(&pem(dir, "client.pem")).unwrap()
}

/// Files for an in-process HTTPS server.
fn tls_files(dir: &Path, client_ca: bool) -> TlsFiles {
    TlsFiles {
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        client_ca: client_ca.then(|| dir.join("ca.crt")),
    }
}

/// An in-process HTTPS server with `dir`'s certificate (asking for a client certificate from
/// `dir`'s CA when `client_ca`), `tweak` applied to its configuration.
pub(crate) async fn https(
    dir: &Path,
    client_ca: bool,
    tweak: impl FnOnce(&mut Config),
) -> ServerHandle {
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls: Some(tls_files(dir, client_ca)),
        ..Config::default()
    };
    tweak(&mut config);
    Server::bind(config).await.unwrap().spawn()
}

/// An SDK client for `url` that never retries.
pub(crate) fn sdk(url: &str) -> sqlhttp::ClientBuilder {
    Client::builder(url)
        .retry(RetryPolicy::never())
        .timeout(Duration::from_secs(10))
}

/// `SELECT 41 + 1` through `client`.
pub(crate) async fn one(client: &Client) -> Result<i64, sqlhttp::Error> {
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

/// Issue 36, finding 11: `SIGHUP` read the TLS files on an async worker, so a file that blocks
/// (a stuck network mount; here a FIFO nobody writes) held that worker, and `SIGTERM` waited on
/// the read for ever. The files are now read on a thread of their own, abandoned after a bound:
/// `/healthz` and new handshakes (with the certificate in use) answer at once, and `SIGTERM`
/// ends the process promptly.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_stuck_on_a_file_stalls_neither_probes_nor_shutdown() {
    let dir = certs(&["127.0.0.1"]);
    let live = tempfile::tempdir().unwrap();
    copy_certs(dir.path(), live.path());
    let key: PathBuf = live.path().join("server.key");
    let mut child = sqlhttpd()
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(live.path().join("server.crt"))
        .arg("--tls-key")
        .arg(&key)
        .spawn()
        .unwrap();
    let url = read_url(&mut child);
    let mut child = Running(child);
    let fresh = || {
        reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([root(dir.path())])
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    assert_eq!(
        fresh()
            .get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    std::fs::remove_file(&key).unwrap();
    let made = Command::new("mkfifo").arg(&key).status().unwrap();
    assert!(made.success());
    hangup(&child.0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The read is stuck in `open` for good; probes and handshakes (a new connection each) go on.
    for _ in 0..5 {
        let started = Instant::now();
        let status = fresh()
            .get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .status();
        let took = started.elapsed();
        assert_eq!(status, 200);
        assert!(took < Duration::from_millis(500), "/healthz took {took:?}");
    }
    let sdk_client = sdk(&url).http_client(fresh()).build().unwrap();
    assert_eq!(one(&sdk_client).await.unwrap(), 42);
    // A second SIGHUP while the first read is stuck starts no second read, and stalls nothing.
    hangup(&child.0);
    assert_eq!(
        fresh()
            .get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let started = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break Some(exit);
        }
        if started.elapsed() > Duration::from_secs(10) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    assert!(
        exited.is_some(),
        "SIGTERM did not end the process within 10 s"
    );
    assert!(took < Duration::from_secs(4), "SIGTERM took {took:?}");
    eprintln!("SIGTERM to exit: {took:?}");
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
