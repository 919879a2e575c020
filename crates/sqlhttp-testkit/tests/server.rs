//! `TestServer` with the real `sqlhttpd` and the real SDK: defaults, configuration, the
//! file-backed database and its temp dir, stop and restart on the same port, and proxies in front.

use std::time::Duration;

use sqlhttp::{ErrorKind, RetryPolicy};
use sqlhttp_server::Config;
use sqlhttp_testkit::{Fault, TestServer};

/// A client that makes exactly one attempt per call, so each test controls every request.
fn one_attempt(builder: sqlhttp::ClientBuilder) -> sqlhttp::Client {
    builder
        .retry(RetryPolicy::never())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[tokio::test]
async fn start_serves_an_in_memory_database_on_loopback() {
    let mut server = TestServer::start().await;
    assert!(server.is_running());
    assert!(server.addr().ip().is_loopback());
    assert_ne!(server.addr().port(), 0);
    assert_eq!(server.url(), format!("http://{}", server.addr()));
    assert_eq!(server.database_path(), None);

    let client = one_attempt(server.client_builder());
    client.ping().await.unwrap();
    client.execute("CREATE TABLE t (x INTEGER)").await.unwrap();
    client.execute("INSERT INTO t VALUES (7)").await.unwrap();
    let x: i64 = client.query("SELECT x FROM t").fetch_one().await.unwrap();
    assert_eq!(x, 7);
    server.stop().await;
}

#[tokio::test]
async fn with_config_keeps_the_config_but_listens_on_an_ephemeral_loopback_port() {
    let config = Config {
        tokens: vec!["s3cret".to_owned()],
        ..Config::default()
    };
    let mut server = TestServer::with_config(config).await;
    assert_ne!(server.addr(), sqlhttp_server::DEFAULT_LISTEN);
    assert_eq!(server.config().tokens, ["s3cret"]);
    assert_eq!(server.config().listen, server.addr());

    // The harness's builders carry the first token; a bare client is refused.
    one_attempt(server.client_builder()).ping().await.unwrap();
    let bare = one_attempt(sqlhttp::Client::builder(server.url()));
    let error = bare.ping().await.unwrap_err();
    assert!(
        matches!(error.kind(), ErrorKind::Unauthorized { .. }),
        "{error:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn file_backed_data_survives_a_restart_on_the_same_url() {
    let mut server = TestServer::file_backed().await;
    let path = server.database_path().unwrap().to_owned();
    assert!(path.starts_with(std::env::temp_dir()));
    let url = server.url();
    let client = one_attempt(server.client_builder());
    client.execute("CREATE TABLE t (x INTEGER)").await.unwrap();
    client.execute("INSERT INTO t VALUES (42)").await.unwrap();

    server.restart().await;
    assert_eq!(server.url(), url);
    assert!(server.is_running());
    let x: i64 = client.query("SELECT x FROM t").fetch_one().await.unwrap();
    assert_eq!(x, 42);
    server.stop().await;
    assert!(path.exists());
}

#[tokio::test]
async fn dropping_a_file_backed_server_removes_its_directory() {
    let mut server = TestServer::file_backed().await;
    let dir = server.database_path().unwrap().parent().unwrap().to_owned();
    one_attempt(server.client_builder())
        .execute("CREATE TABLE t (x INTEGER)")
        .await
        .unwrap();
    assert!(dir.is_dir());
    server.stop().await;
    drop(server);
    assert!(!dir.exists());
}

#[tokio::test]
async fn a_stopped_server_refuses_connections_until_restarted() {
    let mut server = TestServer::start().await;
    let client = one_attempt(server.client_builder());
    server.stop().await;
    server.stop().await; // stopping twice is harmless
    assert!(!server.is_running());

    let error = client.ping().await.unwrap_err();
    assert!(error.is_connection(), "{error:?}");

    server.restart().await;
    client.ping().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_proxy_in_front_injects_faults_and_forwards_the_rest() {
    let mut server = TestServer::start().await;
    let proxy = server.proxy().await;
    assert_eq!(proxy.upstream(), server.addr());
    proxy.push(Fault::unavailable(1));
    let client = one_attempt(server.proxied_client_builder(&proxy));

    let error = client.ping().await.unwrap_err();
    assert!(
        matches!(error.kind(), ErrorKind::Unavailable { .. }),
        "{error:?}"
    );
    assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
    client.ping().await.unwrap();
    assert_eq!((proxy.requests(), proxy.forwarded()), (2, 1));
    server.stop().await;
}

#[tokio::test]
async fn the_proxy_keeps_working_across_a_restart() {
    let mut server = TestServer::file_backed().await;
    let proxy = server.proxy().await;
    let client = one_attempt(server.proxied_client_builder(&proxy));
    client.execute("CREATE TABLE t (x INTEGER)").await.unwrap();

    server.stop().await;
    let error = client.ping().await.unwrap_err();
    assert_eq!(error.status(), Some(502), "{error:?}");

    server.restart().await;
    let n: i64 = client
        .query("SELECT count(*) FROM t")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(n, 0);
    // The ping while the server was down reached the proxy but not the server.
    assert_eq!((proxy.requests(), proxy.forwarded()), (3, 2));
    server.stop().await;
}
