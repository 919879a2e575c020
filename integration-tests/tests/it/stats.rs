//! What a call cost, through the SDK's result types on both engines (SQLite in process;
//! PostgreSQL when `SQLHTTPD_TEST_POSTGRES_URL` names a cluster), issue 40: the server's `stats`
//! (its time, rows read and written, who served it) and the call's attempts on an `ExecResult`, a
//! `Table`, a `RowStream` once it has ended, a batch's report and its tables, and a transaction's
//! steps.

use sqlhttp::{ServedBy, Stats};

use crate::harness::*;
use crate::transactions::on_each_engine;

/// The figures every sqlhttpd success carries: a time, rows written, who served it; one attempt.
fn assert_served(stats: &Stats, rows_written: u64, what: &str) {
    assert!(stats.duration.is_some(), "{what}: {stats:?}");
    assert_eq!(stats.rows_written, Some(rows_written), "{what}: {stats:?}");
    assert_eq!(
        stats.served_by,
        Some(ServedBy::Primary),
        "{what}: {stats:?}"
    );
    assert_eq!(stats.total_attempts, 1, "{what}: {stats:?}");
}

#[tokio::test]
async fn every_result_type_carries_the_server_s_stats_on_both_engines() {
    for (engine, live) in on_each_engine(|_| {}).await {
        let client = live.client();
        let table = unique_table("stats");
        client
            .execute(format!(
                "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, name TEXT)"
            ))
            .await
            .unwrap();

        // An execute: what it wrote.
        let inserted = client
            .execute(format!(
                "INSERT INTO \"{table}\" (id, name) VALUES (1, 'a'), (2, 'b'), (3, 'c')"
            ))
            .await
            .unwrap();
        assert_eq!(inserted.rows_affected, 3);
        assert_served(&inserted.stats, 3, &format!("{engine:?} execute"));

        // A table: what it read (the engine's count), nothing written.
        let read = client
            .query_table(format!("SELECT id, name FROM \"{table}\" ORDER BY id"))
            .await
            .unwrap();
        assert_eq!(read.len(), 3);
        assert_served(read.stats(), 0, &format!("{engine:?} query_table"));
        // SQLite counts the rows its statement stepped through; PostgreSQL's figure is optional
        // (where the server knows it, ADR 0052).
        let rows_read = read.stats().rows_read;
        match engine {
            Engine::Sqlite => assert!(rows_read.is_some_and(|n| n >= 3), "{rows_read:?}"),
            Engine::Postgres => assert!(rows_read.is_none_or(|n| n >= 3), "{rows_read:?}"),
        }

        // A stream: its stats once it has ended, none before.
        let mut rows = client
            .query(format!("SELECT id FROM \"{table}\" ORDER BY id"))
            .fetch::<i64>()
            .await
            .unwrap();
        assert!(rows.request_id().is_some_and(|id| !id.is_empty()));
        assert_eq!(rows.try_next().await.unwrap(), Some(1));
        assert_eq!(rows.stats(), None, "not before the end");
        while rows.try_next().await.unwrap().is_some() {}
        let streamed = rows.stats().expect("the stream ended");
        assert_served(&streamed, 0, &format!("{engine:?} stream"));

        // A batch: the whole batch's, and each statement's own.
        let report = client
            .batch()
            .statement(format!("UPDATE \"{table}\" SET name = 'z' WHERE id <= 2"))
            .statement(format!("SELECT count(*) FROM \"{table}\""))
            .report()
            .await
            .unwrap();
        assert_served(&report.stats, 2, &format!("{engine:?} batch"));
        assert_eq!(report.results[0].stats().rows_written, Some(2));
        assert_eq!(report.results[0].stats().total_attempts, 1);
        assert_eq!(report.results[1].stats().rows_written, Some(0));
        assert!(report.results[1].stats().duration.is_some());

        // A transaction's steps.
        let tx = client.transaction().await.unwrap();
        let deleted = tx
            .execute(format!("DELETE FROM \"{table}\" WHERE id = 3"))
            .await
            .unwrap();
        assert_served(&deleted.stats, 1, &format!("{engine:?} transaction step"));
        let left = tx
            .query_table(format!("SELECT id FROM \"{table}\""))
            .await
            .unwrap();
        assert_eq!(left.len(), 2);
        assert_served(left.stats(), 0, &format!("{engine:?} transaction read"));
        tx.commit().await.unwrap();
    }
}
