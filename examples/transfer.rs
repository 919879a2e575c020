//! A money transfer that stays correct through injected faults: an atomic batch (both balances and
//! the ledger row, or none of them) under an idempotency key of the caller's (the transfer's id), sent
//! through a chaos proxy in front of a live `sqlhttpd`.
//!
//! ```text
//! cargo run --example transfer
//! ```
//!
//! It shows, checking the total balance after each step:
//! 1. the naive way, two `execute` calls, losing money when the connection drops between them;
//! 2. a batch through two lost responses under `retry_writes`: applied exactly once;
//! 3. a batch whose response is lost without `retry_writes`, re-sent later with the same key: replayed;
//! 4. an overdraft refused by a `CHECK` constraint: the error names the statement, nothing applied;
//! 5. twenty concurrent transfers through resets, `503`s and lost responses: every one applied once;
//! 6. the interactive way: twenty concurrent read-decide-write transfers through `transact` (read
//!    the balance, decide in Rust, write), through lost responses at every kind of step: every
//!    one applied once, the overdrafts refused by the application's own check.

use std::time::Duration;

use sqlhttp::{Batch, Client, Executor, RetryPolicy};
use sqlhttp_testkit::{Fault, TestServer};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const ACCOUNTS: i64 = 4;
const OPENING: i64 = 1_000;

#[tokio::main]
async fn main() -> Result {
    let server = TestServer::start().await;
    println!("sqlhttpd at {}", server.url());
    let direct = server.client_builder().build()?;
    direct
        .execute(
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, \
             balance INTEGER NOT NULL CHECK (balance >= 0))",
        )
        .await?;
    direct
        .execute(
            "CREATE TABLE transfers (id TEXT PRIMARY KEY, from_id INTEGER NOT NULL, \
             to_id INTEGER NOT NULL, amount INTEGER NOT NULL)",
        )
        .await?;
    let mut open = direct.batch();
    for id in 0..ACCOUNTS {
        open = open
            .statement("INSERT INTO accounts (id, balance) VALUES (?, ?)")
            .bind(id)
            .bind(OPENING);
    }
    open.await?;
    report(&direct, "opened").await?;

    naive_transfer_loses_money(&server, &direct).await?;
    lost_responses_apply_once(&server, &direct).await?;
    re_sent_later_with_the_same_key(&server, &direct).await?;
    overdraft_applies_nothing(&direct).await?;
    concurrent_transfers(&server, &direct).await?;
    interactive_transfers(&server, &direct).await?;
    Ok(())
}

/// Backoff in milliseconds so the example runs quickly.
fn quick() -> RetryPolicy {
    RetryPolicy::new()
        .with_max_attempts(5)
        .with_initial_backoff(Duration::from_millis(10))
        .with_max_backoff(Duration::from_millis(100))
}

/// One transfer: both balances and the ledger row in one batch, keyed by the transfer's id, so a
/// re-send of the same transfer (a retry, or the caller's own after a crash) is applied at most once.
fn transfer(client: &Client, id: &str, from: i64, to: i64, amount: i64) -> Batch {
    client
        .batch()
        .statement("UPDATE accounts SET balance = balance - ? WHERE id = ?")
        .bind(amount)
        .bind(from)
        .statement("UPDATE accounts SET balance = balance + ? WHERE id = ?")
        .bind(amount)
        .bind(to)
        .statement("INSERT INTO transfers (id, from_id, to_id, amount) VALUES (?, ?, ?, ?)")
        .bind(id)
        .bind(from)
        .bind(to)
        .bind(amount)
        .idempotency_key(format!("transfer-{id}"))
}

async fn total(client: &Client) -> Result<i64> {
    Ok(client
        .query("SELECT sum(balance) FROM accounts")
        .fetch_one()
        .await?)
}

async fn report(client: &Client, when: &str) -> Result<i64> {
    let total = total(client).await?;
    let balances: Vec<i64> = client
        .query("SELECT balance FROM accounts ORDER BY id")
        .fetch_all()
        .await?;
    println!("   {when}: balances {balances:?}, total {total}");
    Ok(total)
}

fn check(holds: bool, what: &str) -> Result {
    if holds {
        Ok(())
    } else {
        Err(format!("invariant broken: {what}").into())
    }
}

async fn naive_transfer_loses_money(server: &TestServer, direct: &Client) -> Result {
    println!("\n1. the naive way: two statements, two requests");
    let proxy = server.proxy().await;
    proxy.push_all([Fault::Pass, Fault::ResetBeforeForward]);
    let client = server.proxied_client_builder(&proxy).build()?;
    client
        .execute("UPDATE accounts SET balance = balance - 100 WHERE id = 0")
        .await?;
    let err = client
        .execute("UPDATE accounts SET balance = balance + 100 WHERE id = 1")
        .await
        .unwrap_err();
    println!("   the credit failed: {err}");
    let total = report(direct, "after").await?;
    check(total == ACCOUNTS * OPENING - 100, "the debit alone landed")?;
    // Put the money back, atomically this time, so the rest starts from a whole total.
    direct
        .batch()
        .statement("UPDATE accounts SET balance = balance + 100 WHERE id = 1")
        .await?;
    report(direct, "repaired").await?;
    Ok(())
}

async fn lost_responses_apply_once(server: &TestServer, direct: &Client) -> Result {
    println!("\n2. a batch through two lost responses, with retry_writes");
    let proxy = server.proxy().await;
    proxy.push_all([Fault::DropAfterForward, Fault::DropAfterForward]);
    let client = server
        .proxied_client_builder(&proxy)
        .retry(quick())
        .retry_writes(true)
        .build()?;
    transfer(&client, "t-2", 0, 1, 250).await?;
    println!(
        "   ok; the server saw it {} times, its key kept one effect",
        proxy.forwarded()
    );
    let total = report(direct, "after").await?;
    check(total == ACCOUNTS * OPENING, "the total is whole")?;
    let ledger: i64 = direct
        .query("SELECT count(*) FROM transfers WHERE id = 't-2'")
        .fetch_one()
        .await?;
    check(ledger == 1, "one ledger row")
}

async fn re_sent_later_with_the_same_key(server: &TestServer, direct: &Client) -> Result {
    println!("\n3. a lost response without retry_writes, re-sent later by the caller");
    let proxy = server.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let client = server.proxied_client_builder(&proxy).build()?;
    let err = transfer(&client, "t-3", 2, 3, 40).await.unwrap_err();
    println!("   {err}\n   outcome unknown: {}", err.is_outcome_unknown());
    // The caller stored the transfer's id (its key) with the work; after a restart it sends the same
    // transfer again. The server replays the stored outcome instead of moving the money twice.
    transfer(direct, "t-3", 2, 3, 40).await?;
    let total = report(direct, "after the re-send").await?;
    check(total == ACCOUNTS * OPENING, "the total is whole")?;
    let moved: i64 = direct
        .query("SELECT balance FROM accounts WHERE id = 3")
        .fetch_one()
        .await?;
    check(moved == OPENING + 40, "moved once")
}

async fn overdraft_applies_nothing(direct: &Client) -> Result {
    println!("\n4. an overdraft");
    let err = transfer(direct, "t-4", 1, 2, 1_000_000).await.unwrap_err();
    println!("   refused at statement {:?}: {err}", err.statement_index());
    check(err.statement_index() == Some(0), "the debit is named")?;
    let total = report(direct, "after").await?;
    check(total == ACCOUNTS * OPENING, "nothing applied")
}

async fn concurrent_transfers(server: &TestServer, direct: &Client) -> Result {
    println!("\n5. twenty concurrent transfers through faults");
    let proxy = server.proxy().await;
    proxy.push_all([
        Fault::DropAfterForward,
        Fault::ResetBeforeForward,
        Fault::unavailable(0),
        Fault::DropAfterForward,
        Fault::status(502),
        Fault::Truncate(30),
    ]);
    let client = server
        .proxied_client_builder(&proxy)
        .retry(quick())
        .retry_writes(true)
        .build()?;
    let before: Vec<i64> = direct
        .query("SELECT balance FROM accounts ORDER BY id")
        .fetch_all()
        .await?;
    let plan: Vec<(i64, i64, i64)> = (0..20)
        .map(|i| {
            let from = i % ACCOUNTS;
            (from, (from + 1 + i % (ACCOUNTS - 1)) % ACCOUNTS, 5 + i)
        })
        .collect();
    let tasks: Vec<_> = plan
        .iter()
        .enumerate()
        .map(|(n, &(from, to, amount))| {
            let batch = transfer(&client, &format!("t-5-{n}"), from, to, amount);
            tokio::spawn(async move { batch.await })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let mut expected = before;
    for &(from, to, amount) in &plan {
        expected[from as usize] -= amount;
        expected[to as usize] += amount;
    }
    println!(
        "   {} transfers; the proxy saw {} requests, the server {}",
        plan.len(),
        proxy.requests(),
        proxy.forwarded()
    );
    let total = report(direct, "after").await?;
    check(total == ACCOUNTS * OPENING, "the total is whole")?;
    let got: Vec<i64> = direct
        .query("SELECT balance FROM accounts ORDER BY id")
        .fetch_all()
        .await?;
    check(got == expected, "every transfer applied exactly once")
}

/// The writes of one transfer: both balances and the ledger row. Written once against
/// [`Executor`]: here it runs inside a transaction, and the same function runs on a `Client`
/// (each statement on its own) with nothing changed.
async fn move_money(
    db: impl Executor<'_>,
    id: &str,
    from: i64,
    to: i64,
    amount: i64,
) -> sqlhttp::Result<()> {
    db.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?")
        .bind(amount)
        .bind(from)
        .await?;
    db.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?")
        .bind(amount)
        .bind(to)
        .await?;
    db.execute("INSERT INTO transfers (id, from_id, to_id, amount) VALUES (?, ?, ?, ?)")
        .bind(id)
        .bind(from)
        .bind(to)
        .bind(amount)
        .await?;
    Ok(())
}

/// One interactive transfer: reads the balance, decides in the application, then writes both
/// balances and the ledger row, all in one transaction; `Ok(false)` when the application refused
/// it (too little money), having rolled back, written nothing.
async fn interactive_transfer(
    client: &Client,
    id: String,
    from: i64,
    to: i64,
    amount: i64,
) -> sqlhttp::Result<bool> {
    client
        .transact(|tx| {
            let id = id.clone();
            async move {
                let balance: i64 = tx
                    .query("SELECT balance FROM accounts WHERE id = ?")
                    .bind(from)
                    .fetch_one()
                    .await?;
                if balance < amount {
                    // The work's own decision stands: `transact` does not commit it.
                    tx.rollback().await?;
                    return Ok(false);
                }
                move_money(&tx, &id, from, to, amount).await?;
                Ok(true)
            }
        })
        .await
}

async fn interactive_transfers(server: &TestServer, direct: &Client) -> Result {
    println!("\n6. the interactive way: twenty concurrent read-decide-write transactions");
    let proxy = server.proxy().await;
    proxy.push_all([
        Fault::DropAfterForward,
        Fault::Pass,
        Fault::DropAfterForward,
        Fault::ResetBeforeForward,
        Fault::unavailable(0),
        Fault::DropAfterForward,
        Fault::status(502),
    ]);
    // Every step of a transaction is safe to send again: no retry_writes needed.
    let client = server
        .proxied_client_builder(&proxy)
        .retry(quick().with_max_attempts(20))
        .build()?;
    let before: Vec<i64> = direct
        .query("SELECT balance FROM accounts ORDER BY id")
        .fetch_all()
        .await?;
    // Every fourth one asks for more than any account holds: the application refuses it.
    let plan: Vec<(i64, i64, i64)> = (0..20)
        .map(|i| {
            let from = i % ACCOUNTS;
            let amount = if i % 4 == 3 { 1_000_000 } else { 7 + i };
            (from, (from + 1) % ACCOUNTS, amount)
        })
        .collect();
    let tasks: Vec<_> = plan
        .iter()
        .enumerate()
        .map(|(n, &(from, to, amount))| {
            let client = client.clone();
            tokio::spawn(async move {
                interactive_transfer(&client, format!("t-6-{n}"), from, to, amount).await
            })
        })
        .collect();
    let mut expected = before;
    for (task, &(from, to, amount)) in tasks.into_iter().zip(&plan) {
        if task.await?? {
            expected[from as usize] -= amount;
            expected[to as usize] += amount;
        } else {
            check(amount == 1_000_000, "only the overdrafts are refused")?;
        }
    }
    println!(
        "   the proxy saw {} requests, the server {}",
        proxy.requests(),
        proxy.forwarded()
    );
    let total = report(direct, "after").await?;
    check(total == ACCOUNTS * OPENING, "the total is whole")?;
    let got: Vec<i64> = direct
        .query("SELECT balance FROM accounts ORDER BY id")
        .fetch_all()
        .await?;
    check(got == expected, "every transfer applied exactly once")?;
    let ledger: i64 = direct
        .query("SELECT count(*) FROM transfers WHERE id LIKE 't-6-%'")
        .fetch_one()
        .await?;
    check(ledger == 15, "one ledger row per transfer made")
}
