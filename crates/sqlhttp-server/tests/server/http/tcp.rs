//! Real servers over loopback TCP: serving through `Server::bind(..).spawn()`, a file database
//! surviving a shutdown and a new server on the same path and port, a locked file answering
//! 503, and 409 for a key whose first request is still running.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{Config, Database, Server, ServerHandle};

use crate::common::{TempDb, http_client, post_over_http, serve};

async fn post(
    client: &reqwest::Client,
    handle: &ServerHandle,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let (status, headers, bytes) =
        post_over_http(client, &handle.url(), "/api/v1/sql", headers, &body).await;
    (status, headers, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn serves_over_tcp_with_auth_and_health() {
    let handle = serve(Config {
        tokens: vec!["tok".into()],
        ..Config::default()
    })
    .await;
    assert!(handle.url().starts_with("http://127.0.0.1:"));
    assert_eq!(handle.url(), format!("http://{}", handle.local_addr()));
    let client = http_client();
    let health = client
        .get(format!("{}/healthz", handle.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok");

    let (status, headers, body) = post(&client, &handle, &[], json!({"sql": "SELECT 1"})).await;
    assert_eq!(status, 401);
    assert_eq!(headers["www-authenticate"], "Bearer");
    assert_eq!(body["error"]["code"], "UNAUTHORIZED");

    let (status, _, body) = post(
        &client,
        &handle,
        &[("authorization", "Bearer tok"), ("sqlhttp-attempt", "1/3")],
        json!({"sql": "SELECT ? AS n", "params": [i64::MAX]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["rows"], json!([[i64::MAX]]));
    handle.shutdown().await;
}

#[tokio::test]
async fn a_file_database_survives_shutdown_and_rebinding_the_same_port() {
    let db = TempDb::new("persist");
    let client = http_client();
    let first = serve(Config {
        database: db.database(),
        ..Config::default()
    })
    .await;
    let addr = first.local_addr();
    let (status, _, _) = post(
        &client,
        &first,
        &[],
        json!({"sql": "CREATE TABLE t (v TEXT)"}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = post(
        &client,
        &first,
        &[("idempotency-key", "persisted")],
        json!({"sql": "INSERT INTO t VALUES ('kept')"}),
    )
    .await;
    assert_eq!(status, 200);
    let started = Instant::now();
    first.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "idle keep-alive connections do not hold shutdown for the grace period"
    );

    // The connection is closed: the file can be written by someone else at once.
    let other = rusqlite::Connection::open(db.path()).unwrap();
    other
        .execute_batch("INSERT INTO t VALUES ('outside')")
        .unwrap();
    drop(other);

    let second = Server::bind(Config {
        listen: addr,
        database: db.database(),
        ..Config::default()
    })
    .await
    .unwrap()
    .spawn();
    assert_eq!(second.local_addr(), addr);
    let (status, _, body) = post(
        &client,
        &second,
        &[],
        json!({"sql": "SELECT v FROM t ORDER BY rowid"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["rows"], json!([["kept"], ["outside"]]));
    // Idempotency outcomes are durable too.
    let (status, headers, _) = post(
        &client,
        &second,
        &[("idempotency-key", "persisted")],
        json!({"sql": "INSERT INTO t VALUES ('kept')"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["idempotent-replayed"], "true");
    second.shutdown().await;
}

#[tokio::test]
async fn a_locked_file_database_answers_503_with_retry_after() {
    let db = TempDb::new("locked");
    let handle = serve(Config {
        database: db.database(),
        ..Config::default()
    })
    .await;
    let client = http_client();
    let (status, _, _) = post(&client, &handle, &[], json!({"sql": "CREATE TABLE t (v)"})).await;
    assert_eq!(status, 200);

    let locker = rusqlite::Connection::open(db.path()).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let (status, headers, body) = post(
        &client,
        &handle,
        &[],
        json!({"sql": "INSERT INTO t VALUES (1)"}),
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(body["error"]["code"], "UNAVAILABLE");
    // The database is in WAL mode: reads go on beside another process's write lock.
    let (status, _, _) = post(&client, &handle, &[], json!({"sql": "SELECT * FROM t"})).await;
    assert_eq!(status, 200);
    locker.execute_batch("COMMIT").unwrap();
    let (status, _, _) = post(
        &client,
        &handle,
        &[],
        json!({"sql": "INSERT INTO t VALUES (1)"}),
    )
    .await;
    assert_eq!(status, 200);
    handle.shutdown().await;
}

#[tokio::test]
async fn a_key_still_running_is_409_and_shutdown_stays_bounded() {
    let handle = serve(Config::default()).await;
    let client = http_client();
    // Never finishes on its own: whichever request claims the key keeps it in flight.
    let endless = json!({
        "sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    });
    let send = |client: reqwest::Client| {
        let url = format!("{}/api/v1/sql", handle.url());
        let body = endless.to_string();
        async move {
            client
                .post(url)
                .header("idempotency-key", "busy")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
        }
    };
    let mut first = tokio::spawn(send(client.clone()));
    let mut second = tokio::spawn(send(client.clone()));
    let (answered, still_running) = tokio::select! {
        done = &mut first => (done, second),
        done = &mut second => (done, first),
    };
    let answered = answered.unwrap().unwrap();
    assert_eq!(answered.status(), 409);
    assert_eq!(answered.headers()["retry-after"], "1");
    let body: Value = serde_json::from_slice(&answered.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "IDEMPOTENCY_KEY_IN_USE");

    let started = Instant::now();
    handle.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    // The runaway request ended too: with a 503 or a cut connection, never a hang.
    let outcome = tokio::time::timeout(Duration::from_secs(5), still_running)
        .await
        .expect("the running request ended")
        .unwrap();
    if let Ok(response) = outcome {
        assert_eq!(response.status(), 503);
    }
}

#[tokio::test]
async fn bind_errors_are_typed() {
    let taken = serve(Config::default()).await;
    let err = Server::bind(Config {
        listen: taken.local_addr(),
        ..Config::default()
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, sqlhttp_server::ServerError::Bind { .. }),
        "{err}"
    );
    let missing_dir = TempDb::new("no-such-dir");
    let err = Server::bind(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        database: Database::File(missing_dir.path().join("inner.db")),
        ..Config::default()
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, sqlhttp_server::ServerError::OpenDatabase { .. }),
        "{err}"
    );
    taken.shutdown().await;
}
