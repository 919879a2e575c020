//! Reads the server verifies: a statement sent with `"read_only": true` runs only if it cannot
//! write; every write form is refused with `403 READ_ONLY` before anything changes, and every
//! read form passes. On SQLite (memory and file) and, when there is one, PostgreSQL. And what a
//! read-only credential may do, on both engines.

use axum::Router;
use serde_json::{Value, json};
use sqlhttp_server::Config;

use crate::common::{
    READER, TempDb, WRITER, app_with, batch_with as batch, ok, post_with, with_writer_and_reader,
};
use crate::engines::{Engine, app_on, engine_app, needs_postgres, on_both_engines};

on_both_engines!(read_only_credentials_run_read_only_transactions);

/// Sends `sql` marked read-only.
async fn read_only(router: &Router, sql: &str) -> crate::common::Reply {
    post_with(router, &[], &json!({"sql": sql, "read_only": true})).await
}

/// What the database holds, as a read sees it: the rows of `t` and the tables there are.
async fn state(router: &Router, tables: &str) -> (Value, Value) {
    let rows = ok(router, "SELECT id, v FROM t ORDER BY id", json!([])).await["rows"].clone();
    let tables = ok(router, tables, json!([])).await["rows"].clone();
    (rows, tables)
}

async fn writes_are_refused_and_change_nothing(
    engine: &str,
    router: &Router,
    set_up: &[&str],
    writes: &[&str],
    tables: &str,
) {
    ok(
        router,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)",
        json!([]),
    )
    .await;
    ok(router, "INSERT INTO t (id, v) VALUES (1, 10)", json!([])).await;
    for sql in set_up {
        ok(router, sql, json!([])).await;
    }
    let before = state(router, tables).await;
    for sql in writes {
        let reply = read_only(router, sql).await;
        assert_eq!(
            (reply.status, reply.code().as_str()),
            (403, "READ_ONLY"),
            "{engine}: {sql}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.contains("execute") && message.contains("read_only"),
            "{engine}: {sql}: the refusal says what to do instead: {message}"
        );
        assert_eq!(
            state(router, tables).await,
            before,
            "{engine}: {sql} changed nothing"
        );
    }
}

async fn reads_pass(engine: &str, router: &Router, reads: &[&str]) {
    for sql in reads {
        let reply = read_only(router, sql).await;
        assert_eq!(
            reply.status,
            200,
            "{engine}: {sql}: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
}

const SQLITE_TABLES: &str = "SELECT name FROM sqlite_schema ORDER BY name";

const SQLITE_SET_UP: &[&str] = &[
    "CREATE TABLE audit (n INTEGER)",
    "CREATE TRIGGER t_audit AFTER UPDATE ON t BEGIN INSERT INTO audit VALUES (1); END",
    "CREATE VIEW tv AS SELECT id, v FROM t",
];

const SQLITE_WRITES: &[&str] = &[
    "INSERT INTO t (id, v) VALUES (2, 20)",
    "WITH n(x) AS (SELECT 3) INSERT INTO t (id, v) SELECT x, x FROM n",
    "INSERT INTO t (id, v) VALUES (4, 40) RETURNING id",
    "REPLACE INTO t (id, v) VALUES (1, 11)",
    "INSERT OR REPLACE INTO t (id, v) VALUES (1, 12)",
    "UPDATE t SET v = v + 1",
    "DELETE FROM t",
    "CREATE TABLE other (x)",
    "CREATE INDEX t_v ON t (v)",
    "ALTER TABLE t ADD COLUMN w INTEGER",
    "DROP TABLE audit",
    "DROP VIEW tv",
];

const SQLITE_READS: &[&str] = &[
    "SELECT * FROM t",
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 100) SELECT i FROM r",
    "SELECT * FROM tv",
    "VALUES (1), (2)",
    "EXPLAIN SELECT * FROM t",
    "EXPLAIN QUERY PLAN SELECT * FROM t WHERE id = 1",
    "PRAGMA table_info(t)",
    "PRAGMA user_version",
];

#[tokio::test]
async fn on_sqlite_every_write_form_is_refused_and_every_read_form_passes() {
    let file = TempDb::new("verified_reads");
    for (engine, router) in [
        ("sqlite::memory:", app_with(&Config::default())),
        (
            "sqlite:FILE",
            app_with(&Config {
                database: file.database(),
                ..Config::default()
            }),
        ),
    ] {
        writes_are_refused_and_change_nothing(
            engine,
            &router,
            SQLITE_SET_UP,
            SQLITE_WRITES,
            SQLITE_TABLES,
        )
        .await;
        reads_pass(engine, &router, SQLITE_READS).await;
    }
}

const POSTGRES_TABLES: &str =
    "SELECT relname::text FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY 1";

const POSTGRES_SET_UP: &[&str] = &[
    "CREATE TABLE audit (n integer)",
    "CREATE SEQUENCE s",
    "CREATE FUNCTION audit_it() RETURNS trigger LANGUAGE plpgsql AS \
     'BEGIN INSERT INTO audit VALUES (1); RETURN NEW; END'",
    "CREATE TRIGGER t_audit AFTER UPDATE ON t FOR EACH ROW EXECUTE FUNCTION audit_it()",
    "CREATE FUNCTION writes() RETURNS integer LANGUAGE sql AS \
     'INSERT INTO t (id, v) VALUES (9, 90) RETURNING id'",
    "CREATE VIEW tv AS SELECT id, v FROM t",
];

const POSTGRES_WRITES: &[&str] = &[
    "INSERT INTO t (id, v) VALUES (2, 20)",
    "WITH moved AS (INSERT INTO t (id, v) VALUES (3, 30) RETURNING id) SELECT id FROM moved",
    "INSERT INTO t (id, v) VALUES (4, 40) RETURNING id",
    "INSERT INTO t (id, v) VALUES (1, 11) ON CONFLICT (id) DO UPDATE SET v = 11",
    "UPDATE t SET v = v + 1",
    "DELETE FROM t",
    "SELECT nextval('s')",
    "SELECT setval('s', 42)",
    "SELECT writes()",
    "CREATE TABLE other (x integer)",
    "CREATE INDEX t_v ON t (v)",
    "ALTER TABLE t ADD COLUMN w integer",
    "DROP TABLE audit CASCADE",
    "EXPLAIN ANALYZE INSERT INTO t (id, v) VALUES (5, 50)",
];

const POSTGRES_READS: &[&str] = &[
    "SELECT * FROM t",
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 100) SELECT i FROM r",
    "SELECT * FROM tv",
    "VALUES (1), (2)",
    "EXPLAIN SELECT * FROM t",
    "SELECT last_value FROM s",
];

needs_postgres! {
    #[tokio::test]
    async fn on_postgres_every_write_form_is_refused_and_every_read_form_passes() {
        let Some(router) = app_on("verified_reads", |_| {}).await else {
            return;
        };
        writes_are_refused_and_change_nothing(
            "postgres",
            &router,
            POSTGRES_SET_UP,
            POSTGRES_WRITES,
            POSTGRES_TABLES,
        )
        .await;
        reads_pass("postgres", &router, POSTGRES_READS).await;
        let sequence = ok(&router, "SELECT last_value FROM s", json!([])).await;
        assert_eq!(
            sequence["rows"],
            json!([[1]]),
            "nextval and setval were refused"
        );
    }
}

#[tokio::test]
async fn the_flag_is_a_boolean_and_belongs_to_a_batch_not_its_statements() {
    let router = app_with(&Config::default());
    let reply = post_with(
        &router,
        &[],
        &json!({"sql": "SELECT 1", "read_only": "yes"}),
    )
    .await;
    assert_eq!((reply.status, reply.code().as_str()), (400, "BAD_REQUEST"));
    for absent in [json!(false), Value::Null] {
        let body = json!({"sql": "CREATE TABLE IF NOT EXISTS w (x)", "read_only": absent});
        let reply = post_with(&router, &[], &body).await;
        assert_eq!(reply.status, 200, "{absent}: a write runs");
    }
    let batch = json!({"statements": [{"sql": "SELECT 1", "read_only": true}]});
    let reply = crate::common::send(
        &router,
        "POST",
        "/api/v1/batch",
        &[("content-type", "application/json")],
        batch.to_string(),
    )
    .await;
    assert_eq!((reply.status, reply.code().as_str()), (400, "BAD_REQUEST"));
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("belongs to the batch"),
        "{}",
        reply.json()
    );
}

#[tokio::test]
async fn a_keyed_read_only_write_is_refused_and_stores_nothing() {
    let router = app_with(&Config::default());
    ok(
        &router,
        "CREATE TABLE t (id INTEGER PRIMARY KEY)",
        json!([]),
    )
    .await;
    let body = json!({"sql": "INSERT INTO t (id) VALUES (1)", "read_only": true});
    let refused = post_with(&router, &[("idempotency-key", "k-1")], &body).await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (403, "READ_ONLY")
    );
    // The same key then runs the write for real: nothing was stored under it.
    let body = json!({"sql": "INSERT INTO t (id) VALUES (1)"});
    let written = post_with(&router, &[("idempotency-key", "k-1")], &body).await;
    assert_eq!(
        written.status,
        200,
        "{}",
        String::from_utf8_lossy(&written.body)
    );
    assert_eq!(written.header("idempotent-replayed"), None);
}

/// A read-only credential's statements run in a read-only transaction: every write is refused
/// (alone or in a batch, with its index) and nothing of it is kept.
async fn read_only_credentials_run_read_only_transactions(engine: Engine) {
    let router = engine_app!(engine, with_writer_and_reader);
    let (as_writer, as_reader) = (WRITER, READER);
    let create = post_with(
        &router,
        &as_writer,
        &json!({"sql": "CREATE TABLE t (x INTEGER)"}),
    )
    .await;
    assert_eq!(create.status, 200);
    for statement in [
        "INSERT INTO t VALUES (1)",
        "CREATE TABLE u (x INTEGER)",
        "DROP TABLE t",
    ] {
        let reply = post_with(&router, &as_reader, &json!({ "sql": statement })).await;
        assert_eq!(reply.status, 403, "{statement}");
        assert_eq!(reply.code(), "READ_ONLY", "{statement}");
    }
    let count = post_with(
        &router,
        &as_reader,
        &json!({"sql": "SELECT count(*) FROM t"}),
    )
    .await;
    assert_eq!(count.json()["rows"], json!([[0]]));
    let read_batch = batch(
        &router,
        &as_reader,
        &json!({"statements": [{"sql": "SELECT 1"}, {"sql": "INSERT INTO t VALUES (1)"}]}),
    )
    .await;
    assert_eq!(read_batch.code(), "READ_ONLY");
    assert_eq!(read_batch.json()["error"]["statement"], 1);
}
