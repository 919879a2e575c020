//! Interactive transactions through the SDK against live servers on both engines (SQLite in
//! process; PostgreSQL when `SQLHTTPD_TEST_POSTGRES_URL` names a cluster): a lost response at
//! every step (open, each statement, commit) through the chaos proxy applies every effect once;
//! an idle transaction expires into `TransactionLost`; twenty concurrent read-modify-write
//! transfers through `transact` keep the bank's total; and, on PostgreSQL, two transfers that
//! conflict under `serializable` both end applied once through `transact`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use sqlhttp::{Client, ErrorKind, Isolation};
use sqlhttp_server::{Config, Database};
use sqlhttp_testkit::Fault;

use crate::harness::*;

/// A fresh database on the PostgreSQL cluster named by `SQLHTTPD_TEST_POSTGRES_URL`, served
/// with its own client role; `None` without one.
async fn postgres_config() -> Option<Config> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let url = std::env::var("SQLHTTPD_TEST_POSTGRES_URL").ok()?;
    let name = format!(
        "sqlhttp_it_tx_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
    let (base, _) = url.rsplit_once('/').unwrap();
    let Database::Postgres(url) = format!("{base}/{name}").parse().unwrap() else {
        panic!("a PostgreSQL URL");
    };
    let role = name.replacen("sqlhttp_", "client_", 1);
    Some(Config {
        database: Database::Postgres(url.with_client_role(&role).unwrap()),
        ..Config::default()
    })
}

/// A live server on each engine there is here, with `tweak` applied to its configuration.
pub(crate) async fn on_each_engine(tweak: impl Fn(&mut Config)) -> Vec<(Engine, Live)> {
    let mut sqlite = Config::default();
    tweak(&mut sqlite);
    let mut lives = vec![(Engine::Sqlite, Live::with_config(sqlite).await)];
    match postgres_config().await {
        Some(mut postgres) => {
            tweak(&mut postgres);
            lives.push((Engine::Postgres, Live::with_config(postgres).await));
        }
        None => eprintln!("PostgreSQL half skipped: SQLHTTPD_TEST_POSTGRES_URL is not set"),
    }
    lives
}

/// A fresh table of `n` accounts with `balance` each.
async fn bank(client: &Client, n: i64, balance: i64) -> String {
    let table = unique_table("bank");
    client
        .execute(format!(
            "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"
        ))
        .await
        .unwrap();
    for id in 0..n {
        client
            .execute(format!("INSERT INTO \"{table}\" VALUES (?, ?)"))
            .bind(id)
            .bind(balance)
            .await
            .unwrap();
    }
    table
}

async fn balances(client: &Client, table: &str) -> Vec<i64> {
    client
        .query(format!("SELECT balance FROM \"{table}\" ORDER BY id"))
        .fetch_all()
        .await
        .unwrap()
}

/// Moves `amount` from `from` to `to` in `client`'s transaction: read, decide, write.
async fn transfer(
    tx: &sqlhttp::Transaction,
    table: &str,
    from: i64,
    to: i64,
    amount: i64,
) -> sqlhttp::Result<()> {
    let balance: i64 = tx
        .query(format!("SELECT balance FROM \"{table}\" WHERE id = ?"))
        .bind(from)
        .fetch_one()
        .await?;
    tx.execute(format!("UPDATE \"{table}\" SET balance = ? WHERE id = ?"))
        .bind(balance - amount)
        .bind(from)
        .await?;
    tx.execute(format!(
        "UPDATE \"{table}\" SET balance = balance + ? WHERE id = ?"
    ))
    .bind(amount)
    .bind(to)
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_lost_response_at_every_step_applies_each_effect_once() {
    for (engine, live) in on_each_engine(|_| {}).await {
        let table = bank(&live.client(), 2, 100).await;
        let proxy = live.proxy().await;
        // The answer of every step is lost once: open, three statements, commit.
        proxy.push_all(
            [Fault::DropAfterForward, Fault::Pass]
                .into_iter()
                .cycle()
                .take(10),
        );
        let client = live.via(&proxy).build().unwrap();
        let tx = client.transaction().await.unwrap();
        transfer(&tx, &table, 0, 1, 30).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            proxy.forwarded(),
            10,
            "{engine:?}: every step was sent twice"
        );
        assert_eq!(
            balances(&live.client(), &table).await,
            [70, 130],
            "{engine:?}: and applied once"
        );
        // Nothing of the lost open's first attempt is left holding the database.
        live.client()
            .execute(format!(
                "UPDATE \"{table}\" SET balance = balance WHERE id = 0"
            ))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn an_idle_transaction_expires_into_transaction_lost_and_keeps_nothing() {
    let lives = on_each_engine(|config| {
        config.transactions.idle_timeout = Duration::from_millis(300);
    })
    .await;
    for (engine, live) in lives {
        let client = live.client();
        let table = bank(&client, 2, 100).await;
        let tx = client.transaction().await.unwrap();
        tx.execute(format!("UPDATE \"{table}\" SET balance = 0"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let err = tx.query("SELECT 1").fetch_all::<i64>().await.unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::TransactionLost { code, .. } if code == "TRANSACTION_EXPIRED"),
            "{engine:?}: {err:?}"
        );
        assert!(err.is_transaction_lost());
        assert!(
            tx.commit().await.is_err(),
            "{engine:?}: nothing more runs in it"
        );
        assert_eq!(balances(&client, &table).await, [100, 100], "{engine:?}");
    }
}

#[tokio::test]
async fn twenty_concurrent_read_modify_write_transfers_keep_the_total() {
    // Sixteen places, eight for one credential (ADR 0045): twenty transfers still contend, and
    // the losers' opens are answered `503` and retried. What this test is about is the total, so
    // the retries are not what runs out: under a loaded machine a round of eight transfers took
    // over a second, and thirty 50 ms retries (with the shared retry budget) ran out twice in nine.
    for (engine, live) in on_each_engine(|config| config.transactions.max_open = 16).await {
        let setup = live.client();
        let table = Arc::new(bank(&setup, 5, 1_000).await);
        let client = live
            .builder()
            .retry(fast().with_max_attempts(200))
            .retry_budget(None)
            .build()
            .unwrap();
        let plan: Vec<(i64, i64, i64)> =
            (0..20).map(|i| (i % 5, (i * 3 + 1) % 5, 10 + i)).collect();
        let tasks: Vec<_> = plan
            .iter()
            .map(|&(from, to, amount)| {
                let (client, table) = (client.clone(), Arc::clone(&table));
                tokio::spawn(async move {
                    client
                        .transact(|tx| {
                            let table = Arc::clone(&table);
                            async move { transfer(&tx, &table, from, to, amount).await }
                        })
                        .await
                })
            })
            .collect();
        for (task, transfer) in tasks.into_iter().zip(&plan) {
            task.await
                .unwrap()
                .unwrap_or_else(|err| panic!("{engine:?}: transfer {transfer:?}: {err:?}"));
        }
        let mut expected = vec![1_000i64; 5];
        for (from, to, amount) in plan {
            expected[usize::try_from(from).unwrap()] -= amount;
            expected[usize::try_from(to).unwrap()] += amount;
        }
        let got = balances(&setup, &table).await;
        assert_eq!(
            got.iter().sum::<i64>(),
            5_000,
            "{engine:?}: the total is constant"
        );
        assert_eq!(
            got, expected,
            "{engine:?}: every transfer applied exactly once"
        );
    }
}

/// Two transfers that read the same rows, then both write: under `serializable` PostgreSQL
/// fails one to serialize; `transact` runs it again, and both end applied once. (On SQLite
/// write transactions never overlap: the second waits for the first.)
#[tokio::test]
async fn two_conflicting_serializable_transfers_both_end_applied_once() {
    let Some(config) = postgres_config().await else {
        eprintln!("skipped: SQLHTTPD_TEST_POSTGRES_URL is not set");
        return;
    };
    let live = Live::with_config(config).await;
    let table = Arc::new(bank(&live.client(), 2, 100).await);
    let client = live
        .builder()
        .retry(fast().with_max_attempts(10))
        .build()
        .unwrap();
    let both_read = Arc::new(tokio::sync::Barrier::new(2));
    let runs = Arc::new(AtomicU32::new(0));
    let first_runs = Arc::new(AtomicBool::new(true));
    let transfer_once = |from: i64, to: i64, amount: i64| {
        let (client, table) = (client.clone(), Arc::clone(&table));
        let (both_read, runs, first) = (
            Arc::clone(&both_read),
            Arc::clone(&runs),
            Arc::clone(&first_runs),
        );
        async move {
            client
                .transact(|tx| {
                    let (table, both_read, runs, first) = (
                        Arc::clone(&table),
                        Arc::clone(&both_read),
                        Arc::clone(&runs),
                        Arc::clone(&first),
                    );
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let balance: i64 = tx
                            .query(format!("SELECT balance FROM \"{table}\" WHERE id = ?"))
                            .bind(from)
                            .fetch_one()
                            .await?;
                        let total: i64 = tx
                            .query(format!("SELECT sum(balance) FROM \"{table}\""))
                            .fetch_one()
                            .await?;
                        assert_eq!(total, 200);
                        if first.load(Ordering::SeqCst) {
                            // Both have read before either writes.
                            both_read.wait().await;
                            first.store(false, Ordering::SeqCst);
                        }
                        tx.execute(format!("UPDATE \"{table}\" SET balance = ? WHERE id = ?"))
                            .bind(balance - amount)
                            .bind(from)
                            .await?;
                        tx.execute(format!(
                            "UPDATE \"{table}\" SET balance = balance + ? WHERE id = ?"
                        ))
                        .bind(amount)
                        .bind(to)
                        .await?;
                        Ok(())
                    }
                })
                .await
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(transfer_once(0, 1, 30)),
        tokio::spawn(transfer_once(1, 0, 10))
    );
    a.unwrap().unwrap();
    b.unwrap().unwrap();
    assert!(
        runs.load(Ordering::SeqCst) >= 3,
        "one of them failed to serialize and ran again"
    );
    assert_eq!(balances(&live.client(), &table).await, [80, 120]);
}

#[tokio::test]
async fn isolation_and_read_only_are_the_engines() {
    for (engine, live) in on_each_engine(|_| {}).await {
        let client = live.client();
        let table = bank(&client, 1, 5).await;
        let reader = client.transaction().read_only(true).await.unwrap();
        let err = reader
            .execute(format!("DELETE FROM \"{table}\""))
            .await
            .unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::ReadOnly { .. }),
            "{engine:?}: {err:?}"
        );
        reader.commit().await.unwrap();
        let repeatable = client
            .transaction()
            .isolation(Isolation::RepeatableRead)
            .await;
        match engine {
            Engine::Sqlite => assert_eq!(repeatable.unwrap_err().status(), Some(400)),
            Engine::Postgres => repeatable.unwrap().rollback().await.unwrap(),
        }
        assert_eq!(balances(&client, &table).await, [5]);
    }
}
