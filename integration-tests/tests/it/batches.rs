//! Atomic batches against the live server: all or nothing, exactly once through lost responses
//! under `retry_writes` (one attempt without it), read-only batches through resets and `503`s, a
//! write refused in a read-only batch, concurrent transfers, and a write batch through every fault
//! of the matrix.

use std::time::Duration;

use serde::Deserialize;
use sqlhttp::{Batch, Client, ErrorKind, RetryPolicy};
use sqlhttp_testkit::Fault;

use crate::harness::*;

#[derive(Debug, PartialEq, Deserialize)]
struct Account {
    id: i64,
    balance: i64,
}

/// A fresh accounts table with `n` accounts of `balance` each; balances cannot go negative.
async fn accounts(client: &Client, n: i64, balance: i64) -> String {
    let table = unique_table("accounts");
    client
        .execute(format!(
            "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0))"
        ))
        .await
        .unwrap();
    let mut batch = client.batch();
    for id in 0..n {
        batch = batch
            .statement(format!(
                "INSERT INTO \"{table}\" (id, balance) VALUES (?, ?)"
            ))
            .bind(id)
            .bind(balance);
    }
    batch.await.unwrap();
    table
}

fn transfer(client: &Client, table: &str, from: i64, to: i64, amount: i64) -> Batch {
    client
        .batch()
        .statement(format!(
            "UPDATE \"{table}\" SET balance = balance + ? WHERE id = ?"
        ))
        .bind(amount)
        .bind(to)
        .statement(format!(
            "UPDATE \"{table}\" SET balance = balance - ? WHERE id = ?"
        ))
        .bind(amount)
        .bind(from)
}

async fn balances(client: &Client, table: &str) -> Vec<i64> {
    client
        .query(format!("SELECT balance FROM \"{table}\" ORDER BY id"))
        .fetch_all()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_failure_in_the_last_statement_applies_nothing() {
    let live = Live::start().await;
    let client = live.client();
    let table = accounts(&client, 2, 100).await;
    let err = transfer(&client, &table, 0, 1, 30)
        .statement(format!(
            "INSERT INTO \"{table}\" (id, balance) VALUES (0, 1)"
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::ConstraintViolation { .. }),
        "{err:?}"
    );
    assert_eq!(err.statement_index(), Some(2));
    assert_eq!(balances(&client, &table).await, [100, 100]);

    let tables = transfer(&client, &table, 0, 1, 30)
        .statement(format!("SELECT id, balance FROM \"{table}\" ORDER BY id"))
        .await
        .unwrap();
    assert_eq!(
        tables[2].rows_as::<Account>().unwrap(),
        [
            Account { id: 0, balance: 70 },
            Account {
                id: 1,
                balance: 130
            }
        ]
    );
}

#[tokio::test]
async fn two_lost_responses_under_retry_writes_apply_the_batch_exactly_once() {
    let live = Live::start().await;
    let table = accounts(&live.client(), 2, 100).await;
    let proxy = live.proxy().await;
    proxy.push_all([Fault::DropAfterForward, Fault::DropAfterForward]);
    let client = live.via(&proxy).retry_writes(true).build().unwrap();
    let tables = transfer(&client, &table, 0, 1, 25).await.unwrap();
    assert_eq!(tables.len(), 2);
    assert_eq!(proxy.forwarded(), 3, "the server saw the batch three times");
    assert_eq!(
        balances(&live.client(), &table).await,
        [75, 125],
        "and applied it once"
    );
}

#[tokio::test]
async fn without_retry_writes_a_lost_response_is_one_attempt_and_its_key_re_sends_it_once() {
    let live = Live::start().await;
    let table = accounts(&live.client(), 2, 100).await;
    let proxy = live.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let client = live.via(&proxy).build().unwrap();
    let err = transfer(&client, &table, 0, 1, 10).await.unwrap_err();
    assert!(err.is_connection() && err.is_outcome_unknown(), "{err:?}");
    assert_eq!((err.attempts(), proxy.forwarded()), (1, 1));
    assert_eq!(balances(&live.client(), &table).await, [90, 110]);
    // The caller re-sends the same batch with the error's key: replayed, not run again.
    let key = err.idempotency_key().unwrap().to_owned();
    transfer(&live.client(), &table, 0, 1, 10)
        .idempotency_key(key)
        .await
        .unwrap();
    assert_eq!(balances(&live.client(), &table).await, [90, 110]);
}

#[tokio::test]
async fn a_read_only_batch_is_retried_through_a_reset_and_a_503() {
    let live = Live::start().await;
    let table = accounts(&live.client(), 3, 50).await;
    let proxy = live.proxy().await;
    proxy.push_all([Fault::ResetBeforeForward, Fault::unavailable(0)]);
    let client = live.via(&proxy).build().unwrap();
    let tables = client
        .batch()
        .statement(format!("SELECT sum(balance) FROM \"{table}\""))
        .statement(format!("SELECT id, balance FROM \"{table}\" WHERE id = ?"))
        .bind(2)
        .read_only(true)
        .await
        .unwrap();
    assert_eq!(tables[0].rows_as::<i64>().unwrap(), [150]);
    assert_eq!(
        tables[1].rows_as::<Account>().unwrap(),
        [Account { id: 2, balance: 50 }]
    );
    assert_eq!((proxy.requests(), proxy.forwarded()), (3, 1));
}

#[tokio::test]
async fn a_write_in_a_read_only_batch_is_refused_with_nothing_applied() {
    let live = Live::start().await;
    let client = live.client();
    let table = accounts(&client, 2, 100).await;
    let err = client
        .batch()
        .statement(format!("SELECT count(*) FROM \"{table}\""))
        .statement(format!("UPDATE \"{table}\" SET balance = 0"))
        .read_only(true)
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::ReadOnly { .. }), "{err:?}");
    assert_eq!((err.statement_index(), err.attempts()), (Some(1), 1));
    assert_eq!(err.status(), Some(403));
    assert_eq!(balances(&client, &table).await, [100, 100]);
}

#[tokio::test]
async fn twenty_concurrent_transfers_keep_the_total_and_apply_each_once() {
    let live = Live::start().await;
    let table = accounts(&live.client(), 5, 1_000).await;
    let proxy = live.proxy().await;
    // Some of the transfers lose a response or meet a busy server on the way.
    proxy.push_all([
        Fault::DropAfterForward,
        Fault::unavailable(0),
        Fault::DropAfterForward,
        Fault::ResetBeforeForward,
        Fault::status(502),
    ]);
    // Attempts to spare: a retry may meet one of the other transfers' faults, or `409` while
    // its first attempt is still queued behind the others on a slow machine.
    let client = live
        .via(&proxy)
        .retry_writes(true)
        .retry(fast().with_max_attempts(5))
        .build()
        .unwrap();
    let plan: Vec<(i64, i64, i64)> = (0..20).map(|i| (i % 5, (i * 3 + 1) % 5, 10 + i)).collect();
    let tasks: Vec<_> = plan
        .iter()
        .map(|&(from, to, amount)| {
            let transfer = transfer(&client, &table, from, to, amount);
            tokio::spawn(async move { transfer.await })
        })
        .collect();
    for (task, transfer) in tasks.into_iter().zip(&plan) {
        task.await
            .unwrap()
            .unwrap_or_else(|err| panic!("transfer {transfer:?}: {err:?}"));
    }
    let mut expected = vec![1_000i64; 5];
    for (from, to, amount) in plan {
        expected[from as usize] -= amount;
        expected[to as usize] += amount;
    }
    let got = balances(&live.client(), &table).await;
    assert_eq!(got.iter().sum::<i64>(), 5_000, "the total is constant");
    assert_eq!(got, expected, "every transfer applied exactly once");
}

#[tokio::test]
async fn a_write_batch_through_every_fault_of_the_matrix_applies_once() {
    let live = Live::start().await;
    let table = accounts(&live.client(), 2, 1_000).await;
    let proxy = live.proxy().await;
    // The timeout cuts the stalls; it is long enough that a slow moment of the machine (the
    // first requests of a cold test binary) is not a stall. An attempt that timed out holds its
    // key until the server is done with it, so the next one may meet `409` and wait it out.
    let client = live
        .via(&proxy)
        .retry_writes(true)
        .retry(fast().with_max_attempts(6))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let matrix = [
        Fault::CloseBeforeForward,
        Fault::ResetBeforeForward,
        Fault::DropAfterForward,
        Fault::Truncate(40),
        Fault::Delay(Duration::from_millis(50)),
        Fault::Stall,
        Fault::status(502),
        Fault::status(504),
        Fault::unavailable(0),
        Fault::rate_limited(0),
    ];
    let mut expected = [1_000, 1_000];
    for (round, fault) in matrix.into_iter().enumerate() {
        // Each fault twice in a row; a delay lets the first attempt through.
        let times = if matches!(fault, Fault::Delay(_)) {
            1
        } else {
            2
        };
        proxy.push_all(std::iter::repeat_n(fault.clone(), times));
        let amount = round as i64 + 1;
        transfer(&client, &table, 0, 1, amount)
            .await
            .unwrap_or_else(|err| panic!("{fault:?}: {err:?}"));
        expected[0] -= amount;
        expected[1] += amount;
        assert_eq!(
            balances(&live.client(), &table).await,
            expected,
            "{fault:?}: applied once"
        );
    }
    // A final failure is not retried, whatever the fault before it.
    proxy.push(Fault::DropAfterForward);
    let err = transfer(&client, &table, 0, 1, 1_000_000)
        .retry(RetryPolicy::new().with_max_attempts(4))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::ConstraintViolation { .. }),
        "{err:?}"
    );
    assert_eq!(err.statement_index(), Some(1));
    assert_eq!(balances(&live.client(), &table).await, expected);
}
