//! The protocol's error table as a caller sees it through the SDK, from the real server; and the
//! failures that must not be retried, shown not to be (the proxy counts what reached it).

use std::time::Duration;

use sqlhttp::{ConstraintKind, ErrorKind, RetryPolicy};
use sqlhttp_server::{Config, Database};
use sqlhttp_testkit::{Fault, TestServer};

use crate::harness::*;

#[tokio::test]
async fn bad_sql_is_final() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    let client = live.via(&proxy).build().unwrap();
    let err = client
        .query("SELEC 1")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Sql { .. }), "{err:?}");
    assert_eq!(
        (err.status(), err.code(), err.attempts()),
        (Some(400), Some("SQL_ERROR"), 1)
    );
    let err = client
        .query("SELECT * FROM no_such_table")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("SQL_ERROR"));
    let err = client
        .query("SELECT ?, ?")
        .bind(1)
        .fetch_all::<(i64, i64)>()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("SQL_ERROR"), "wrong parameter count");
    assert_eq!(proxy.requests(), 3);
}

#[tokio::test]
async fn a_wrong_token_is_final() {
    let live = Live::with_config(Config {
        tokens: vec!["right-token".into()],
        ..Config::default()
    })
    .await;
    let proxy = live.proxy().await;
    live.via(&proxy).build().unwrap().ping().await.unwrap();
    let client = sqlhttp::Client::builder(proxy.url())
        .bearer_token("wrong-token")
        .build()
        .unwrap();
    let err = client.ping().await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unauthorized { .. }),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 1);
    assert!(!format!("{err} {err:?}").contains("wrong-token"));
    let anonymous = sqlhttp::Client::builder(proxy.url()).build().unwrap();
    assert_eq!(anonymous.ping().await.unwrap_err().status(), Some(401));
    assert_eq!(proxy.requests(), 3);
}

#[tokio::test]
async fn a_constraint_violation_is_final_even_for_retried_writes() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("unique");
    let rows = seed(&client, &table, 2).await;
    let proxy = live.proxy().await;
    let retrying = live.via(&proxy).retry_writes(true).build().unwrap();
    let err = retrying.insert(&table, &rows[..1]).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::ConstraintViolation { .. }),
        "{err:?}"
    );
    assert_eq!(
        (err.status(), err.attempts(), proxy.requests()),
        (Some(409), 1, 1)
    );
    assert_eq!(
        err.constraint(),
        Some(&ConstraintKind::PrimaryKey),
        "{err:?}"
    );
    assert!(err.is_sent() && !err.is_outcome_unknown());
    assert_eq!(count(&client, &table).await, 2);
}

#[tokio::test]
async fn a_constraint_violation_names_its_kind() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("kinds");
    client
        .execute(format!(
            "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, email TEXT UNIQUE, \
             n INTEGER NOT NULL CHECK (n > 0))"
        ))
        .await
        .unwrap();
    let insert = |sql: &str| client.execute(format!("INSERT INTO \"{table}\" {sql}"));
    insert("(id, email, n) VALUES (1, 'a@example.com', 1)")
        .await
        .unwrap();
    for (sql, kind) in [
        (
            "(id, email, n) VALUES (2, 'a@example.com', 1)",
            ConstraintKind::Unique,
        ),
        (
            "(id, email, n) VALUES (3, 'b@example.com', NULL)",
            ConstraintKind::NotNull,
        ),
        (
            "(id, email, n) VALUES (4, 'c@example.com', -1)",
            ConstraintKind::Check,
        ),
    ] {
        let err = insert(sql).await.unwrap_err();
        assert_eq!(err.constraint(), Some(&kind), "{sql}: {err:?}");
        assert!(!format!("{err:?}").contains("example.com"), "{err:?}");
    }
}

#[tokio::test]
async fn the_sandbox_refuses_attach_with_its_own_kind() {
    let live = Live::start().await;
    // Reaching outside the served database: ATTACH on SQLite, a server file on PostgreSQL.
    let escape = match live.engine().await {
        Engine::Sqlite => "ATTACH DATABASE 'elsewhere.db' AS other",
        Engine::Postgres => "SELECT pg_read_file('/etc/passwd')",
    };
    let err = live.client().execute(escape).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::StatementNotAllowed { .. }),
        "{err:?}"
    );
    assert_eq!((err.status(), err.attempts()), (Some(403), 1));
}

#[tokio::test]
async fn a_payload_over_the_limit_is_final() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    let client = live.via(&proxy).build().unwrap();
    let huge = format!("SELECT '{}'", "x".repeat(1_100_000));
    let err = client.query(huge).fetch_all::<String>().await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::PayloadTooLarge { .. }),
        "{err:?}"
    );
    assert_eq!(
        (err.status(), err.attempts(), proxy.requests()),
        (Some(413), 1, 1)
    );
}

#[tokio::test]
async fn a_501_is_final_and_a_404_names_itself() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    proxy.push(Fault::status(501));
    let client = live.via(&proxy).build().unwrap();
    let err = client.ping().await.unwrap_err();
    assert_eq!(
        (err.status(), err.attempts(), proxy.requests()),
        (Some(501), 1, 1)
    );

    let wrong_path = sqlhttp::Client::builder(format!("{}/not/here", live.url()))
        .build()
        .unwrap();
    let err = wrong_path.ping().await.unwrap_err();
    assert_eq!(
        (err.status(), err.code(), err.attempts()),
        (Some(404), Some("NOT_FOUND"), 1)
    );
}

#[tokio::test]
async fn a_locked_database_is_unavailable_with_a_wait_and_is_retried() {
    let server = TestServer::file_backed_with_config(Config {
        database: Database::Memory,
        ..Config::default()
    })
    .await;
    let path = server.database_path().expect("file-backed").to_owned();
    let client = server
        .client_builder()
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    client.execute("CREATE TABLE t (n INTEGER)").await.unwrap();

    // Another process holds the write lock.
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let err = client
        .execute("INSERT INTO t VALUES (1)")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable { .. }),
        "{err:?}"
    );
    assert_eq!(
        (err.status(), err.retry_after()),
        (Some(503), Some(Duration::from_secs(1)))
    );
    assert!(err.is_retryable());

    // A read retried past the lock's release succeeds.
    let reader = server
        .client_builder()
        .retry(
            RetryPolicy::new()
                .with_max_attempts(5)
                .with_max_backoff(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        holder.execute_batch("COMMIT").unwrap();
    });
    let n: i64 = reader
        .query("SELECT count(*) FROM t")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(n, 0);
    release.await.unwrap();
}

#[tokio::test]
async fn a_payload_over_the_limit_sent_straight_to_the_server_is_final() {
    let live = Live::start().await;
    let client = live.client();
    for size in [1_100_000, 4_000_000] {
        let huge = format!("SELECT '{}'", "x".repeat(size));
        let err = client.query(huge).fetch_all::<String>().await.unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::PayloadTooLarge { .. }),
            "{size}: {err:?}"
        );
        assert_eq!(err.attempts(), 1);
    }
}
