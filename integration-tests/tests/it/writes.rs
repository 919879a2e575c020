//! Writes through a dropped response: `execute` never retries, `insert` retries only when asked, and
//! the server's idempotency keys make the retry exactly-once — or, with keys off, show the duplicate
//! that makes `retry_writes` opt-in.

use sqlhttp::ErrorKind;
use sqlhttp_server::Config;
use sqlhttp_testkit::Fault;

use crate::harness::*;

#[tokio::test]
async fn execute_through_a_dropped_response_errors_once_and_applies_once() {
    let live = Live::start().await;
    let table = unique_table("exec_drop");
    create(&live.client(), &table, true).await;
    let proxy = live.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let client = live.via(&proxy).retry_writes(true).build().unwrap();
    let err = client
        .execute(format!(
            "INSERT INTO \"{table}\" (name, price) VALUES ('once', 1)"
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Connection { .. }),
        "{err:?}"
    );
    assert_eq!(
        (err.attempts(), proxy.requests(), proxy.forwarded()),
        (1, 1, 1)
    );
    assert_eq!(
        count(&live.client(), &table).await,
        1,
        "the server did the work exactly once"
    );
}

#[tokio::test]
async fn insert_without_retry_writes_errors_and_applies_once() {
    let live = Live::start().await;
    let table = unique_table("insert_drop");
    create(&live.client(), &table, true).await;
    let proxy = live.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let client = live.via(&proxy).build().unwrap();
    let err = client.insert(&table, &items(5)).await.unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    assert_eq!((err.attempts(), proxy.forwarded()), (1, 1));
    assert_eq!(count(&live.client(), &table).await, 5);
}

#[tokio::test]
async fn insert_with_retry_writes_succeeds_exactly_once() {
    let live = Live::start().await;
    let table = unique_table("insert_retry");
    create(&live.client(), &table, false).await;
    let proxy = live.proxy().await;
    proxy.push_all([Fault::DropAfterForward, Fault::DropAfterForward]);
    let client = live.via(&proxy).retry_writes(true).build().unwrap();
    let rows = items(7);
    assert_eq!(client.insert(&table, &rows).await.unwrap(), 7);
    assert_eq!(
        proxy.forwarded(),
        3,
        "the server saw the statement three times"
    );
    let mut expected = rows;
    expected.sort_by_key(|item| item.id);
    assert_eq!(
        all_rows(&live.client(), &table).await,
        expected,
        "and applied it once"
    );
}

#[tokio::test]
async fn insert_with_retry_writes_against_a_server_without_keys_duplicates() {
    let live = Live::with_config(Config {
        idempotency_ttl: None,
        ..Config::default()
    })
    .await;
    let table = unique_table("insert_dup");
    // No primary key: nothing stops the duplicate, as on many real tables.
    create(&live.client(), &table, false).await;
    let proxy = live.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let client = live.via(&proxy).retry_writes(true).build().unwrap();
    assert_eq!(client.insert(&table, &items(4)).await.unwrap(), 4);
    assert_eq!(
        count(&live.client(), &table).await,
        8,
        "the documented risk: a retried write is applied twice when the server ignores the key"
    );
}

#[tokio::test]
async fn a_retried_write_that_never_reached_the_server_is_applied_once() {
    let live = Live::start().await;
    let table = unique_table("insert_503");
    create(&live.client(), &table, true).await;
    let proxy = live.proxy().await;
    proxy.push_all([Fault::unavailable(0), Fault::CloseBeforeForward]);
    let client = live.via(&proxy).retry_writes(true).build().unwrap();
    assert_eq!(client.insert(&table, &items(3)).await.unwrap(), 3);
    assert_eq!((proxy.requests(), proxy.forwarded()), (3, 1));
    assert_eq!(count(&live.client(), &table).await, 3);
}

#[tokio::test]
async fn a_chunked_insert_retries_each_statement_once_and_keeps_every_row() {
    let live = Live::start().await;
    let table = unique_table("chunks");
    create(&live.client(), &table, true).await;
    let proxy = live.proxy().await;
    // Four statements of 25 rows; the second and fourth lose their responses once.
    proxy.push_all([
        Fault::Pass,
        Fault::DropAfterForward,
        Fault::Pass,
        Fault::Pass,
        Fault::DropAfterForward,
    ]);
    let client = live
        .via(&proxy)
        .retry_writes(true)
        .insert_max_params(100)
        .build()
        .unwrap();
    let mut rows = items(100);
    assert_eq!(client.insert(&table, &rows).await.unwrap(), 100);
    assert_eq!(proxy.forwarded(), 6);
    rows.sort_by_key(|item| item.id);
    assert_eq!(all_rows(&live.client(), &table).await, rows);
}

#[tokio::test]
async fn a_lost_write_re_sent_by_a_new_call_with_the_callers_key_is_applied_once() {
    let live = Live::start().await;
    let table = unique_table("caller_key");
    // No primary key: only the idempotency key stands between a re-send and a duplicate.
    create(&live.client(), &table, false).await;
    let proxy = live.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let rows = items(5);
    let key = format!("import-{table}");
    let first = live.via(&proxy).build().unwrap();
    let err = first
        .insert(&table, &rows)
        .idempotency_key(key.clone())
        .await
        .unwrap_err();
    assert!(
        err.is_connection() && err.is_sent() && err.is_outcome_unknown(),
        "{err:?}"
    );
    assert_eq!(err.idempotency_key(), Some(key.as_str()));
    assert_eq!(proxy.forwarded(), 1);

    // Later, from another client (another process, say): the same rows under the same key.
    let again = live
        .client()
        .insert(&table, &rows)
        .idempotency_key(err.idempotency_key().unwrap())
        .await
        .unwrap();
    assert_eq!(again, 5, "the stored outcome is replayed");
    assert_eq!(count(&live.client(), &table).await, 5, "applied once");
}

#[tokio::test]
async fn a_chunked_insert_re_sent_with_its_key_runs_only_the_missing_statements() {
    let live = Live::start().await;
    let table = unique_table("caller_key_chunks");
    create(&live.client(), &table, false).await;
    let proxy = live.proxy().await;
    // Four statements of 25 rows: the first commits, the second commits but loses its response.
    proxy.push_all([Fault::Pass, Fault::DropAfterForward]);
    let rows = items(100);
    let client = live
        .via(&proxy)
        .insert_max_params(100)
        .retry(sqlhttp::RetryPolicy::never())
        .build()
        .unwrap();
    // A key of this run's own: an external server keeps keys between runs.
    let key = format!("{table}-job");
    let err = client
        .insert(&table, &rows)
        .idempotency_key(key.clone())
        .await
        .unwrap_err();
    assert_eq!(err.rows_inserted(), Some(25), "{err:?}");
    assert_eq!(err.idempotency_key(), Some(key.as_str()));
    assert_eq!(proxy.forwarded(), 2, "the later statements were never sent");
    // Through a clean path now: statements 0 and 1 replay, 2 and 3 run.
    let clean = live.builder().insert_max_params(100).build().unwrap();
    let report = clean
        .insert(&table, &rows)
        .idempotency_key(key.clone())
        .report()
        .await
        .unwrap();
    assert_eq!(
        (report.rows, report.statements, report.replayed),
        (100, 4, 2),
        "{report:?}"
    );
    assert!(!report.is_replay());
    assert_eq!(count(&live.client(), &table).await, 100, "every row once");
    // Once more: every statement replays, and the report says nothing was written.
    let again = clean
        .insert(&table, &rows)
        .idempotency_key(key)
        .report()
        .await
        .unwrap();
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(count(&live.client(), &table).await, 100);
}

#[tokio::test]
async fn execute_returning_through_a_dropped_response_is_sent_once() {
    let live = Live::start().await;
    let table = unique_table("returning_drop");
    create(&live.client(), &table, true).await;
    let proxy = live.proxy().await;
    proxy.push(Fault::DropAfterForward);
    let client = live
        .via(&proxy)
        .retry_writes(true)
        .retry(fast().with_max_attempts(5))
        .build()
        .unwrap();
    let err = client
        .execute(format!(
            "INSERT INTO \"{table}\" (name, price) VALUES ('once', 1) RETURNING id"
        ))
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(err.is_connection() && err.is_outcome_unknown(), "{err:?}");
    assert_eq!(err.idempotency_key(), None, "execute carries no key");
    assert_eq!(
        (err.attempts(), proxy.requests(), proxy.forwarded()),
        (1, 1, 1)
    );
    assert_eq!(count(&live.client(), &table).await, 1, "one effect");
}

#[tokio::test]
async fn execute_returning_decodes_the_new_rows() {
    let live = Live::start().await;
    let table = unique_table("returning");
    create(&live.client(), &table, true).await;
    let ids: Vec<(i64, String)> = live
        .client()
        .execute(format!(
            "INSERT INTO \"{table}\" (id, name, price) VALUES (7, 'a', 1), (8, 'b', 2) RETURNING id, name"
        ))
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(ids, vec![(7, "a".to_owned()), (8, "b".to_owned())]);
}

#[tokio::test]
async fn a_replay_that_answers_a_retry_is_not_reported_as_an_earlier_calls() {
    let live = Live::start().await;
    let table = unique_table("own_replay");
    create(&live.client(), &table, false).await;
    let proxy = live.proxy().await;
    // The first attempt is applied and its answer lost; the retry is answered from the store.
    proxy.push(Fault::DropAfterForward);
    let client = live.via(&proxy).retry_writes(true).build().unwrap();
    let report = client
        .insert(&table, &items(3))
        .idempotency_key(format!("{table}-own"))
        .report()
        .await
        .unwrap();
    assert_eq!(proxy.forwarded(), 2, "the retry reached the server");
    assert_eq!((report.rows, report.replayed), (3, 0), "{report:?}");
    assert!(!report.is_replay(), "this call wrote the rows: {report:?}");
    assert_eq!(count(&live.client(), &table).await, 3);
}
