//! The SDK's one statement surface against live servers on both engines (SQLite in process;
//! PostgreSQL when `SQLHTTPD_TEST_POSTGRES_URL` names a cluster), ADR 0047: one repository
//! function written against `Executor` runs on a `Client` and inside a `Transaction`; a
//! transaction's `fetch()` streams 100,000 rows holding one row at a time; and a streamed
//! step whose answer the chaos proxy cuts part-way is read again from the server's stored
//! result, never run again (an `UPDATE ... RETURNING` is applied once).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::{Deserialize, Deserializer, Serialize};
use sqlhttp::Executor;
use sqlhttp_testkit::Fault;

use crate::harness::*;
use crate::transactions::on_each_engine;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Book {
    id: i64,
    title: String,
    year: Option<i64>,
}

/// The repository: written once, for whatever runs statements.
async fn save(db: impl Executor<'_>, table: &str, book: &Book) -> sqlhttp::Result<u64> {
    db.insert(table, std::slice::from_ref(book)).await
}

async fn load(db: impl Executor<'_>, table: &str, id: i64) -> sqlhttp::Result<Option<Book>> {
    db.query(format!(
        "SELECT id, title, year FROM \"{table}\" WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional()
    .await
}

async fn retitle(
    db: impl Executor<'_>,
    table: &str,
    id: i64,
    title: &str,
) -> sqlhttp::Result<Book> {
    let changed = db
        .execute(format!("UPDATE \"{table}\" SET title = ? WHERE id = ?"))
        .bind(title)
        .bind(id)
        .await?;
    assert_eq!(changed.rows_affected, 1);
    // A reference to an executor is one: the function hands it on.
    Ok(load(&db, table, id).await?.expect("the row just changed"))
}

#[tokio::test]
async fn one_repository_function_runs_on_the_client_and_in_a_transaction_on_both_engines() {
    for (engine, live) in on_each_engine(|_| {}).await {
        let client = live.client();
        let table = unique_table("books");
        client
            .execute(format!(
                "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, title TEXT NOT NULL, year INTEGER)"
            ))
            .await
            .unwrap();
        let dune = Book {
            id: 1,
            title: "Dune".into(),
            year: Some(1965),
        };
        let messiah = Book {
            id: 2,
            title: "Messiah".into(),
            year: None,
        };

        // On the client.
        assert_eq!(save(&client, &table, &dune).await.unwrap(), 1);
        assert_eq!(
            load(&client, &table, 1).await.unwrap().as_ref(),
            Some(&dune)
        );

        // In a transaction: its own writes are visible to it, to no one else until it commits.
        let tx = client.transaction().await.unwrap();
        assert_eq!(save(&tx, &table, &messiah).await.unwrap(), 1);
        let renamed = retitle(&tx, &table, 1, "Dune (1965)").await.unwrap();
        assert_eq!(renamed.title, "Dune (1965)");
        assert_eq!(load(&tx, &table, 2).await.unwrap().as_ref(), Some(&messiah));
        assert_eq!(
            load(&client, &table, 2).await.unwrap(),
            None,
            "{engine:?}: not before the commit"
        );
        tx.commit().await.unwrap();
        assert_eq!(
            load(&client, &table, 2).await.unwrap().as_ref(),
            Some(&messiah),
            "{engine:?}"
        );
        assert_eq!(
            load(&client, &table, 1).await.unwrap().unwrap().title,
            "Dune (1965)"
        );

        // Through `transact`, and a rollback keeps nothing.
        let title = client
            .transact(|tx| {
                let table = table.clone();
                async move {
                    retitle(&tx, &table, 2, "Dune Messiah")
                        .await
                        .map(|b| b.title)
                }
            })
            .await
            .unwrap();
        assert_eq!(title, "Dune Messiah");
        let mut tx = client.transaction().await.unwrap();
        retitle(&mut tx, &table, 2, "never").await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(
            load(&client, &table, 2).await.unwrap().unwrap().title,
            "Dune Messiah",
            "{engine:?}"
        );
    }
}

/// Rows alive now, and the most alive at once: a row counts from its decoding to its drop.
static ALIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counted {
    n: i64,
    _label: String,
}

impl<'de> Deserialize<'de> for Counted {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (n, label) = <(i64, String)>::deserialize(deserializer)?;
        let alive = ALIVE.fetch_add(1, Ordering::SeqCst) + 1;
        PEAK.fetch_max(alive, Ordering::SeqCst);
        Ok(Counted { n, _label: label })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        ALIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// This process's resident set in KiB (Linux), for the figure printed beside the assertion.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

const MANY: i64 = 100_000;

#[tokio::test]
async fn a_transaction_streams_100_000_rows_holding_one_row_at_a_time() {
    for (engine, live) in on_each_engine(|_| {}).await {
        let client = live.client();
        let table = unique_table("many");
        client
            .execute(format!(
                "CREATE TABLE \"{table}\" (n INTEGER PRIMARY KEY, label TEXT NOT NULL)"
            ))
            .await
            .unwrap();
        client
            .execute(format!(
                "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {MANY}) \
                 INSERT INTO \"{table}\" (n, label) SELECT n, 'row number ' || n FROM c"
            ))
            .await
            .unwrap();
        let tx = client.transaction().read_only(true).await.unwrap();
        PEAK.store(0, Ordering::SeqCst);
        let before = rss_kib();
        let started = Instant::now();
        let mut rows = tx
            .query(format!("SELECT n, label FROM \"{table}\" ORDER BY n"))
            .fetch::<Counted>();
        let (mut count, mut last) = (0_i64, 0_i64);
        let mut peak_rss = before;
        while let Some(row) = rows.try_next().await.unwrap() {
            assert_eq!(row.n, last + 1, "{engine:?}: in order, none missing");
            last = row.n;
            count += 1;
            if count % 10_000 == 0 {
                peak_rss = peak_rss.max(rss_kib());
            }
        }
        drop(rows);
        let elapsed = started.elapsed();
        let peak = PEAK.load(Ordering::SeqCst);
        // The same rows buffered by `fetch_all`, for contrast: every one alive at once.
        PEAK.store(0, Ordering::SeqCst);
        let all: Vec<Counted> = tx
            .query(format!("SELECT n, label FROM \"{table}\" ORDER BY n"))
            .fetch_all()
            .await
            .unwrap();
        let all_rss = rss_kib();
        let all_peak = PEAK.load(Ordering::SeqCst);
        drop(all);
        eprintln!(
            "{engine:?}: a transaction streamed {count} rows in {elapsed:?}, at most {peak} row(s) \
             alive at once, resident set {before:?} KiB before and at most {peak_rss:?} KiB while \
             streaming (the in-process server's stored result, about 2.7 MB, included); \
             fetch_all of the same: {all_peak} rows alive, resident set {all_rss:?} KiB"
        );
        assert_eq!(count, MANY, "{engine:?}");
        assert!(peak <= 2, "{engine:?}: {peak} rows alive at once");
        assert_eq!(
            all_peak, MANY as usize,
            "{engine:?}: the contrast holds every row"
        );
        tx.commit().await.unwrap();
    }
}

#[tokio::test]
async fn a_streamed_step_whose_answer_is_cut_is_read_again_and_never_run_again() {
    const ROWS: i64 = 20_000;
    for (engine, live) in on_each_engine(|_| {}).await {
        let client = live.client();
        let table = unique_table("cut");
        client
            .execute(format!(
                "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)"
            ))
            .await
            .unwrap();
        client
            .execute(format!(
                "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {ROWS}) \
                 INSERT INTO \"{table}\" (id, v) SELECT n, 0 FROM c"
            ))
            .await
            .unwrap();
        let proxy = live.proxy().await;
        // Uncompressed answers: a cut in a compressed one lands before the decompressor has
        // given its first row, where the transport's own retry, not the stream's, re-sends it.
        let plain = reqwest::Client::builder()
            .no_gzip()
            .no_zstd()
            .build()
            .unwrap();
        let via = live.via(&proxy).http_client(plain).build().unwrap();
        let tx = via.transaction().await.unwrap();
        // The statement's answer is cut after 64 KiB, head included (about a third of it): the
        // connection closes with thousands of rows given.
        proxy.push(Fault::Truncate(64 * 1024));
        let mut rows = tx
            .execute(format!("UPDATE \"{table}\" SET v = v + 1 RETURNING id, v"))
            .fetch::<(i64, i64)>();
        let mut ids = BTreeSet::new();
        while let Some((id, v)) = rows.try_next().await.unwrap() {
            assert_eq!(v, 1, "{engine:?}: row {id} was updated twice");
            assert!(ids.insert(id), "{engine:?}: row {id} given twice");
        }
        drop(rows);
        assert_eq!(ids.len() as i64, ROWS, "{engine:?}: every row once");
        tx.commit().await.unwrap();
        assert_eq!(
            proxy.forwarded(),
            4,
            "{engine:?}: the open, the statement twice, the COMMIT"
        );
        let twice: i64 = client
            .query(format!("SELECT count(*) FROM \"{table}\" WHERE v <> 1"))
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(twice, 0, "{engine:?}: the re-send was answered, not run");
    }
}

/// A step's result too large to keep (past `--max-result-bytes`) is never partly stored or partly
/// sent: the stream's first read is an error, before any row. It is `422 RESULT_TOO_LARGE`, the
/// statement undone and the transaction going on, on SQLite always; on PostgreSQL when the
/// statement's undo completes within the server's bound for stopping work (1 s), else the
/// transaction is ended (`TRANSACTION_ABORTED`, saying `--max-result-bytes`) and nothing of it
/// is committed (ADR 0047).
#[tokio::test]
async fn a_streamed_step_too_large_to_keep_is_refused_before_any_row() {
    const ROWS: i64 = 20_000;
    let lives = on_each_engine(|config| config.limits.max_result_bytes = 64 * 1024).await;
    for (engine, live) in lives {
        let client = live.client();
        let table = unique_table("too_large");
        client
            .execute(format!(
                "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)"
            ))
            .await
            .unwrap();
        client
            .execute(format!(
                "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {ROWS}) \
                 INSERT INTO \"{table}\" (id, v) SELECT n, 0 FROM c"
            ))
            .await
            .unwrap();
        let tx = client.transaction().await.unwrap();
        let mut rows = tx
            .execute(format!("UPDATE \"{table}\" SET v = v + 1 RETURNING id, v"))
            .fetch::<(i64, i64)>();
        let err = rows.try_next().await.unwrap_err();
        assert!(!err.is_outcome_unknown(), "{engine:?}: {err:?}");
        drop(rows);
        if err.is_transaction_lost() {
            assert_eq!(engine, Engine::Postgres, "{err:?}");
            assert!(err.to_string().contains("--max-result-bytes"), "{err}");
            assert!(tx.commit().await.unwrap_err().is_transaction_lost());
            let sum: i64 = client
                .query(format!("SELECT sum(v) FROM \"{table}\""))
                .fetch_one()
                .await
                .unwrap();
            assert_eq!(sum, 0, "{engine:?}: nothing committed");
            continue;
        }
        assert_eq!(err.code(), Some("RESULT_TOO_LARGE"), "{engine:?}: {err:?}");
        let updated: i64 = tx
            .query(format!("SELECT count(*) FROM \"{table}\" WHERE v <> 0"))
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(updated, 0, "{engine:?}: undone");
        let one = tx
            .execute(format!("UPDATE \"{table}\" SET v = 7 WHERE id = 1"))
            .await
            .unwrap();
        assert_eq!(one.rows_affected, 1);
        tx.commit().await.unwrap();
        let sum: i64 = client
            .query(format!("SELECT sum(v) FROM \"{table}\""))
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(
            sum, 7,
            "{engine:?}: only the statement after the refusal committed"
        );
    }
}
