//! A schema that changes while the server serves: after DDL commits, every later statement on
//! every connection (readers, the writer, batches, keyed requests) sees the new schema, and
//! readers and writers running beside a migrating client get no error the SQL does not imply.
//! Each case runs on an in-memory database, a database file and, when there is one, PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use serde_json::{Value, json};
use sqlhttp_server::Config;

use crate::common::{TempDb, app_with, batch_with as batch, ok, post_with, sql};
use crate::engines::app_on;

/// Requests sent at once to warm every reader connection (more than the default four).
const WARM: usize = 12;

/// The engines one case runs on: a label and a router, with what keeps a file database alive.
struct Engines {
    cases: Vec<(&'static str, Router)>,
    _files: Vec<TempDb>,
}

async fn engines(test: &str) -> Engines {
    let file = TempDb::new(test);
    let mut cases = vec![
        ("sqlite::memory:", app_with(&Config::default())),
        (
            "sqlite:FILE",
            app_with(&Config {
                database: file.database(),
                ..Config::default()
            }),
        ),
    ];
    if let Some(router) = app_on(test, |_| {}).await {
        cases.push(("postgres", router));
    }
    Engines {
        cases,
        _files: vec![file],
    }
}

/// Sends `count` copies of `sql_text` at once and returns the replies in order.
async fn at_once(router: &Router, sql_text: &str, count: usize) -> Vec<crate::common::Reply> {
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let router = router.clone();
            let sql_text = sql_text.to_owned();
            tokio::spawn(async move { sql(&router, &sql_text, json!([])).await })
        })
        .collect();
    let mut replies = Vec::with_capacity(count);
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    replies
}

fn column_names(body: &Value) -> Vec<String> {
    body["columns"]
        .as_array()
        .unwrap_or_else(|| panic!("no columns in {body}"))
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

fn describe(reply: &crate::common::Reply) -> String {
    format!("{} {}", reply.status, String::from_utf8_lossy(&reply.body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_and_created_anew_is_seen_in_its_new_shape_everywhere() {
    for (engine, router) in engines("schema_drop_create").await.cases {
        ok(
            &router,
            "CREATE TABLE t1 (a INTEGER, b INTEGER, c INTEGER)",
            json!([]),
        )
        .await;
        for reply in at_once(&router, "SELECT * FROM t1", WARM).await {
            assert_eq!(reply.status, 200, "{engine}: {}", describe(&reply));
        }
        ok(&router, "DROP TABLE t1", json!([])).await;
        ok(&router, "CREATE TABLE t1 (x INTEGER, y INTEGER)", json!([])).await;
        let mut failures = Vec::new();
        for _ in 0..WARM {
            let reply = sql(&router, "INSERT INTO t1 VALUES (1, 2)", json!([])).await;
            if reply.status != 200 {
                failures.push(format!("INSERT: {}", describe(&reply)));
            }
        }
        for _ in 0..WARM {
            let reply = sql(&router, "SELECT * FROM t1", json!([])).await;
            if reply.status != 200 {
                failures.push(format!("SELECT: {}", describe(&reply)));
            } else if column_names(&reply.json()) != ["x", "y"] {
                failures.push(format!("SELECT: old shape {}", describe(&reply)));
            }
        }
        assert!(failures.is_empty(), "{engine}: {failures:#?}");
        let count = ok(&router, "SELECT count(*) AS n FROM t1", json!([])).await;
        assert_eq!(count["rows"], json!([[WARM]]), "{engine}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_column_is_answered_by_every_connection() {
    for (engine, router) in engines("schema_add_column").await.cases {
        ok(
            &router,
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
            json!([]),
        )
        .await;
        ok(
            &router,
            "INSERT INTO users (id, name) VALUES (1, 'ada')",
            json!([]),
        )
        .await;
        for reply in at_once(&router, "SELECT * FROM users", WARM).await {
            assert_eq!(reply.status, 200, "{engine}: {}", describe(&reply));
        }
        ok(
            &router,
            "ALTER TABLE users ADD COLUMN email TEXT",
            json!([]),
        )
        .await;
        for reply in at_once(&router, "SELECT * FROM users", WARM).await {
            assert_eq!(reply.status, 200, "{engine}: {}", describe(&reply));
            let body = reply.json();
            assert_eq!(
                column_names(&body),
                ["id", "name", "email"],
                "{engine}: {body}"
            );
            assert_eq!(body["rows"], json!([[1, "ada", null]]), "{engine}: {body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_keyed_requests_see_a_changed_schema() {
    for (engine, router) in engines("schema_batch_keyed").await.cases {
        ok(
            &router,
            "CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER)",
            json!([]),
        )
        .await;
        for reply in at_once(&router, "SELECT * FROM t", WARM).await {
            assert_eq!(reply.status, 200, "{engine}: {}", describe(&reply));
        }
        let migrate = json!({"statements": [
            {"sql": "DROP TABLE t"},
            {"sql": "CREATE TABLE t (x INTEGER, y INTEGER)"},
        ]});
        let migrated = batch(&router, &[], &migrate).await;
        assert_eq!(migrated.status, 200, "{engine}: {}", describe(&migrated));

        let keyed = post_with(
            &router,
            &[("idempotency-key", "schema-keyed-1")],
            &json!({"sql": "INSERT INTO t VALUES (1, 2)"}),
        )
        .await;
        assert_eq!(keyed.status, 200, "{engine}: {}", describe(&keyed));
        let both = json!({"statements": [
            {"sql": "INSERT INTO t VALUES (3, 4)"},
            {"sql": "SELECT * FROM t ORDER BY x"},
        ]});
        let written = batch(&router, &[], &both).await;
        assert_eq!(written.status, 200, "{engine}: {}", describe(&written));
        let read =
            json!({"read_only": true, "statements": [{"sql": "SELECT * FROM t ORDER BY x"}]});
        for _ in 0..WARM {
            let reply = batch(&router, &[], &read).await;
            assert_eq!(reply.status, 200, "{engine}: {}", describe(&reply));
            let result = &reply.json()["results"][0];
            assert_eq!(column_names(result), ["x", "y"], "{engine}: {result}");
            assert_eq!(
                result["rows"],
                json!([[1, 2], [3, 4]]),
                "{engine}: {result}"
            );
        }
    }
}

/// The migrations one round of the churn test runs, with whether the table is missing for a
/// moment after the step (a read of a dropped table is an error the SQL implies).
fn migrations(round: usize) -> Vec<(Value, bool)> {
    let one = |sql: String| json!({"statements": [{"sql": sql}]});
    vec![
        (
            one(format!("ALTER TABLE churn ADD COLUMN extra_{round} TEXT")),
            false,
        ),
        (
            one(format!("CREATE INDEX churn_v_{round} ON churn (v)")),
            false,
        ),
        (one(format!("DROP INDEX churn_v_{round}")), false),
        (one("ALTER TABLE churn RENAME TO churn_moved".into()), true),
        (one("ALTER TABLE churn_moved RENAME TO churn".into()), false),
        // A new shape in one atomic step: readers see the old table or the new one.
        (
            json!({"statements": [
                {"sql": "DROP TABLE churn"},
                {"sql": format!(
                    "CREATE TABLE churn (id INTEGER PRIMARY KEY, v INTEGER, shape_{round} INTEGER)"
                )},
            ]}),
            false,
        ),
        // The same, one statement at a time: the table is missing in between.
        (one("DROP TABLE churn".into()), true),
        (
            one("CREATE TABLE churn (id INTEGER PRIMARY KEY, v INTEGER)".into()),
            false,
        ),
    ]
}

/// Whether a failed reply is what the SQL implies while the table is missing.
fn is_missing_table(reply: &crate::common::Reply) -> bool {
    if reply.status != 400 {
        return false;
    }
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    message.contains("no such table") || message.contains("does not exist")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_beside_a_migrating_client_get_no_error_the_sql_does_not_imply() {
    const ROUNDS: usize = 12;
    const READERS: usize = 6;
    const WRITERS: usize = 2;
    for (engine, router) in engines("schema_churn").await.cases {
        ok(
            &router,
            "CREATE TABLE churn (id INTEGER PRIMARY KEY, v INTEGER)",
            json!([]),
        )
        .await;
        let done = Arc::new(AtomicBool::new(false));
        let missing = Arc::new(AtomicBool::new(false));
        let windows = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let next_id = Arc::new(AtomicUsize::new(1));
        let mut load = Vec::new();
        for worker in 0..READERS + WRITERS {
            let (router, done, missing, windows, served, next_id) = (
                router.clone(),
                Arc::clone(&done),
                Arc::clone(&missing),
                Arc::clone(&windows),
                Arc::clone(&served),
                Arc::clone(&next_id),
            );
            load.push(tokio::spawn(async move {
                let mut unexpected = Vec::new();
                while !done.load(Ordering::Acquire) {
                    // The table may have been missing while the request ran if it may have been
                    // at its start, or a window without it opened before its end.
                    let missing_at_start = missing.load(Ordering::Acquire);
                    let windows_at_start = windows.load(Ordering::Acquire);
                    let reply = if worker < READERS {
                        sql(&router, "SELECT * FROM churn", json!([])).await
                    } else {
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        sql(
                            &router,
                            "INSERT INTO churn (id, v) VALUES (?, ?)",
                            json!([id, id]),
                        )
                        .await
                    };
                    served.fetch_add(1, Ordering::Relaxed);
                    if reply.status == 200 {
                        let body = reply.json();
                        let width = body["columns"].as_array().map_or(0, Vec::len);
                        let rows = body["rows"].as_array().cloned().unwrap_or_default();
                        if rows
                            .iter()
                            .any(|row| row.as_array().map(Vec::len) != Some(width))
                        {
                            unexpected.push(format!("rows of another width than {body}"));
                        }
                    } else if !((missing_at_start
                        || windows.load(Ordering::Acquire) != windows_at_start)
                        && is_missing_table(&reply))
                    {
                        unexpected.push(describe(&reply));
                    }
                }
                unexpected
            }));
        }
        let started = Instant::now();
        let mut steps = 0;
        for round in 0..ROUNDS {
            for (step, table_missing_after) in migrations(round) {
                // Marked before the step, so a read racing it may see the table gone.
                if table_missing_after {
                    missing.store(true, Ordering::Release);
                    windows.fetch_add(1, Ordering::AcqRel);
                }
                let reply = batch(&router, &[], &step).await;
                assert_eq!(reply.status, 200, "{engine}: {step}: {}", describe(&reply));
                if !table_missing_after {
                    missing.store(false, Ordering::Release);
                }
                steps += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        done.store(true, Ordering::Release);
        let mut unexpected = Vec::new();
        for task in load {
            unexpected.extend(task.await.unwrap());
        }
        let served = served.load(Ordering::Relaxed);
        eprintln!(
            "{engine}: {steps} migrations beside {served} reads and writes in {:?}",
            started.elapsed()
        );
        unexpected.truncate(10);
        assert!(unexpected.is_empty(), "{engine}: {unexpected:#?}");
        assert!(
            served > steps,
            "{engine}: the load ran beside the migrations"
        );
    }
}
