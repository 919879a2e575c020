//! Interactive transactions across two replicas on one database (a SQLite file, or a
//! PostgreSQL database), each with its `--advertise-url`, behind the testkit's balancing chaos
//! proxy: the steps of one transaction land on both replicas in turn, and the one that does not
//! hold it forwards them to the one that does; with the holder gone, the other answers
//! `TRANSACTION_EXPIRED` (nothing committed), never a hang.

use std::net::SocketAddr;
use std::time::Duration;

use sqlhttp::{Client, ErrorKind, RetryPolicy};
use sqlhttp_server::{Config, Server, ServerHandle};
use sqlhttp_testkit::ChaosProxy;

use crate::common::TempDb;
use crate::engines::{Engine, on_both_engines};

on_both_engines!(a_transaction_spans_two_replicas_and_a_gone_holder_is_expired);

/// A configuration for a database two replicas share, with what keeps it alive; `None`
/// without PostgreSQL.
async fn shared(engine: Engine) -> Option<(Config, Option<TempDb>)> {
    match engine {
        Engine::Sqlite => {
            let file = TempDb::new("tx-replicas");
            let config = Config {
                database: file.database(),
                ..Config::default()
            };
            Some((config, Some(file)))
        }
        Engine::Postgres => {
            let url = crate::engines::database("tx_replicas").await?;
            Some((crate::engines::config(&url), None))
        }
    }
}

/// A replica of `config` on a free loopback port, advertising it.
async fn replica(config: &Config) -> (SocketAddr, ServerHandle) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let server = Server::bind(Config {
        listen: addr,
        advertise_url: Some(format!("http://{addr}")),
        ..config.clone()
    })
    .await
    .unwrap();
    (addr, server.spawn())
}

async fn count(client: &Client, table: &str) -> i64 {
    client
        .query(format!("SELECT count(*) FROM {table}"))
        .fetch_one()
        .await
        .unwrap()
}

async fn a_transaction_spans_two_replicas_and_a_gone_holder_is_expired(engine: Engine) {
    let Some((config, _file)) = shared(engine).await else {
        return;
    };
    let (a, first) = replica(&config).await;
    let (b, second) = replica(&config).await;
    let direct = Client::builder(format!("http://{b}")).build().unwrap();
    direct.execute("CREATE TABLE t (x INTEGER)").await.unwrap();
    let proxy = ChaosProxy::start_balanced(vec![a, b]).await.unwrap();
    let client = Client::builder(proxy.url())
        .retry(
            RetryPolicy::new()
                .with_max_attempts(10)
                .with_initial_backoff(Duration::from_millis(5))
                .with_max_backoff(Duration::from_millis(50)),
        )
        .build()
        .unwrap();

    // Round robin: open on the first, then every other step reaches the second, which forwards.
    let tx = client.transaction().await.unwrap();
    for x in 1..=3 {
        tx.execute("INSERT INTO t VALUES (?)")
            .bind(x)
            .await
            .unwrap();
    }
    let seen: i64 = tx
        .query("SELECT count(*) FROM t")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(seen, 3, "every statement ran in the one transaction");
    assert_eq!(
        count(&direct, "t").await,
        0,
        "nothing shows before the commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(count(&direct, "t").await, 3);
    assert!(
        proxy.forwarded_to(a) >= 3 && proxy.forwarded_to(b) >= 3,
        "both replicas took steps"
    );

    // The holder goes away: the other replica cannot reach it and answers from the database.
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO t VALUES (4)").await.unwrap();
    let held_by_first = proxy.forwarded_to(a);
    first.shutdown().await;
    let started = std::time::Instant::now();
    let err = tx.execute("INSERT INTO t VALUES (5)").await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::TransactionLost { code, .. } if code == "TRANSACTION_EXPIRED"),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "never a hang");
    assert!(held_by_first > 0);
    assert_eq!(count(&direct, "t").await, 3, "nothing of it was committed");
    second.shutdown().await;
}
