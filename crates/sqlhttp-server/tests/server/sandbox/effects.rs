//! The sandbox decides on what a statement does, not on how it is spelled (ADR 0023): no
//! temporary object however it is named, no object whose old or new name is the server's, no
//! look at the server's objects, and exactly-once whatever a client sends. On SQLite; where the
//! class applies on PostgreSQL, in `sandbox/pg_sandbox.rs`, with this file's helpers.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sqlhttp_server::Config;

use crate::common::{Reply, TempDb, app_with, memory_app, ok, send, sql};

/// Sends `sqls` as one batch with extra `headers`.
pub(crate) async fn batch(router: &Router, headers: &[(&str, &str)], sqls: &[&str]) -> Reply {
    let body =
        json!({ "statements": sqls.iter().map(|sql| json!({ "sql": sql })).collect::<Vec<_>>() });
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(router, "POST", "/api/v1/batch", &all, body.to_string()).await
}

/// POSTs the JSON text `body` to the SQL endpoint under the idempotency key `key`.
pub(crate) async fn keyed(router: &Router, key: &str, body: &str) -> Reply {
    send(
        router,
        "POST",
        "/api/v1/sql",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", key),
        ],
        body.to_owned(),
    )
    .await
}

/// Asserts a `403 STATEMENT_NOT_ALLOWED` for every statement, each sent on its own and as a
/// batch of its own.
pub(crate) async fn all_refused(router: &Router, statements: &[&str]) {
    for statement in statements {
        let reply = sql(router, statement, json!([])).await;
        assert_eq!(
            reply.status,
            403,
            "{statement}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{statement}");
    }
    all_refused_on_the_writer(router, statements).await;
}

/// Asserts a `403 STATEMENT_NOT_ALLOWED` for every statement, each sent as a batch of its own,
/// which runs on the writer (the one connection with the server's temp table; a single
/// statement is compiled on a reader first).
async fn all_refused_on_the_writer(router: &Router, statements: &[&str]) {
    for statement in statements {
        let reply = batch(router, &[], &[statement]).await;
        assert_eq!(
            reply.status,
            403,
            "{statement}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{statement}");
    }
}

/// The rows `query` answers.
pub(crate) async fn rows(router: &Router, query: &str) -> Value {
    ok(router, query, json!([])).await["rows"].clone()
}

/// The objects in the server's namespace, as the schema table lists them.
const RESERVED_OBJECTS: &str = "SELECT type, name FROM main.sqlite_schema \
WHERE substr(name, 1, 8) = '_sqlhttp' COLLATE NOCASE \
OR substr(tbl_name, 1, 8) = '_sqlhttp' COLLATE NOCASE ORDER BY name";

fn server_objects_only() -> Value {
    json!([
        ["table", "_sqlhttp_idempotency"],
        ["index", "_sqlhttp_idempotency_created_at"]
    ])
}

fn now_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The red team's batch: a temp table renamed to the store's name, which unqualified names
/// found first, so a retried keyed write ran again and a forged outcome was replayed.
#[tokio::test]
async fn a_temp_table_renamed_into_the_store_cannot_replace_it() {
    let router = memory_app();
    ok(
        &router,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)",
        json!([]),
    )
    .await;
    let write = json!({"sql": "INSERT INTO t (v) VALUES ('once')", "params": []}).to_string();
    let first = keyed(&router, "applied", &write).await;
    assert_eq!(first.status, 200);

    // No key and no index: a temporary index was refused already.
    let columns = "(key, request_hash, status, body, created_at)";
    let forged_write =
        json!({"sql": "INSERT INTO t (v) VALUES ('forged')", "params": []}).to_string();
    let forged_hash: String = Sha256::digest(forged_write.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let forged_body = r#"{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":99}"#;
    let plant = format!(
        "INSERT INTO temp.x VALUES \
         ('forged', x'{forged_hash}', 200, CAST('{forged_body}' AS BLOB), {})",
        now_millis()
    );
    let create = format!("CREATE TABLE temp.x {columns}");
    for attack in [
        vec![
            create.as_str(),
            "ALTER TABLE temp.x RENAME TO _sqlhttp_idempotency",
        ],
        vec![
            create.as_str(),
            plant.as_str(),
            "ALTER TABLE \"TEMP\".x RENAME TO \"_SQLHTTP_IDEMPOTENCY\"",
        ],
    ] {
        let reply = batch(&router, &[], &attack).await;
        assert_eq!(
            reply.status,
            403,
            "{attack:?}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED");
    }
    // One statement at a time, the same.
    all_refused(
        &router,
        &[
            create.as_str(),
            "ALTER TABLE temp.x RENAME TO _sqlhttp_idempotency",
        ],
    )
    .await;

    let retry = keyed(&router, "applied", &write).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    let forged = keyed(&router, "forged", &forged_write).await;
    assert_eq!(forged.status, 200);
    assert_eq!(
        forged.header("idempotent-replayed"),
        None,
        "a stored outcome nobody stored: {}",
        String::from_utf8_lossy(&forged.body)
    );
    assert_eq!(
        rows(&router, "SELECT v FROM t ORDER BY id").await,
        json!([["once"], ["forged"]]),
        "the applied write ran once, the other one ran"
    );
    assert_eq!(rows(&router, RESERVED_OBJECTS).await, server_objects_only());
}

/// A temp table of a real table's name caught the writer's writes to it: answered `200`,
/// `rows_affected: 1`, and gone at restart.
#[tokio::test]
async fn a_temp_table_cannot_shadow_a_real_one() {
    let db = TempDb::new("shadow");
    let config = || Config {
        database: db.database(),
        ..Config::default()
    };
    let router = app_with(&config());
    ok(
        &router,
        "CREATE TABLE orders (id INTEGER, item TEXT)",
        json!([]),
    )
    .await;
    all_refused(
        &router,
        &[
            "CREATE TABLE temp.orders (id INTEGER, item TEXT)",
            "CREATE TABLE \"TeMp\".orders (id INTEGER, item TEXT)",
            "CREATE TABLE [temp].orders (id INTEGER, item TEXT)",
            "CREATE TABLE `TEMP`.orders (id INTEGER, item TEXT)",
            "CREATE TABLE /* c */ temp /* c */ . /* c */ orders (id INTEGER, item TEXT)",
            "CREATE TABLE IF NOT EXISTS temp.orders (id INTEGER, item TEXT)",
            "CREATE TABLE temp.orders AS SELECT * FROM main.orders",
            "CREATE TEMP TABLE orders (id INTEGER, item TEXT)",
            "CREATE TEMPORARY TABLE orders (id INTEGER, item TEXT)",
            "CREATE TEMP VIEW orders AS SELECT 1 AS id, 'x' AS item",
            "CREATE VIEW temp.orders AS SELECT 1 AS id, 'x' AS item",
        ],
    )
    .await;
    let insert = ok(&router, "INSERT INTO orders VALUES (1, 'kept')", json!([])).await;
    assert_eq!(insert["rows_affected"], 1);
    drop(router);

    let restarted = app_with(&config());
    assert_eq!(
        rows(&restarted, "SELECT id, item FROM orders").await,
        json!([[1, "kept"]])
    );
}

/// Every kind of temporary object, however the schema is spelled, and every way into the
/// server's own temp table.
#[tokio::test]
async fn temporary_objects_of_every_kind_are_refused() {
    let router = memory_app();
    ok(&router, "CREATE TABLE orders (id INTEGER)", json!([])).await;
    all_refused(
        &router,
        &[
            "CREATE TABLE \"TeMp\".x (a)",
            "CREATE TABLE tEmP.x (a)",
            "CREATE VIEW temp.v AS SELECT 1",
            "CREATE VIEW \"temp\".v AS SELECT * FROM main.orders",
            "CREATE TEMP VIEW v AS SELECT 1",
            // A trigger kept on the writer's connection: every acknowledged write deleted.
            "CREATE TRIGGER temp.wipe AFTER INSERT ON main.orders BEGIN DELETE FROM orders; END",
            "CREATE TRIGGER \"TEMP\".wipe AFTER INSERT ON orders BEGIN DELETE FROM orders; END",
            "CREATE TEMP TRIGGER wipe AFTER INSERT ON orders BEGIN DELETE FROM orders; END",
            // temp in a trigger body.
            "CREATE TRIGGER temp.log AFTER INSERT ON orders \
             BEGIN INSERT INTO temp._sqlhttp_rowid_probe VALUES (new.id); END",
            "CREATE TEMP TRIGGER log AFTER INSERT ON main.orders \
             BEGIN UPDATE orders SET id = (SELECT x FROM _sqlhttp_rowid_probe); END",
            "CREATE VIRTUAL TABLE temp.r USING rtree(id, a, b)",
            "CREATE VIRTUAL TABLE \"TeMp\".f USING fts5(body)",
        ],
    )
    .await;
    // The server's own temp table, on the connection that has it.
    all_refused_on_the_writer(
        &router,
        &[
            "CREATE INDEX temp.i ON _sqlhttp_rowid_probe (x)",
            "CREATE TRIGGER t AFTER INSERT ON _sqlhttp_rowid_probe BEGIN SELECT 1; END",
            "SELECT * FROM temp._sqlhttp_rowid_probe",
            "SELECT count(*) FROM \"TEMP\"._sqlhttp_rowid_probe",
            "INSERT INTO temp._sqlhttp_rowid_probe VALUES (1)",
            "DELETE FROM temp._sqlhttp_rowid_probe",
            "DROP TABLE temp._sqlhttp_rowid_probe",
            "ALTER TABLE temp._sqlhttp_rowid_probe RENAME TO p",
            "PRAGMA temp.table_info(_sqlhttp_rowid_probe)",
            "SELECT * FROM temp.sqlite_schema",
            "SELECT * FROM sqlite_temp_schema",
            "SELECT count(*) FROM sqlite_temp_master",
        ],
    )
    .await;
    // The writer still works, and its writes are kept.
    ok(&router, "INSERT INTO orders VALUES (1)", json!([])).await;
    ok(&router, "INSERT INTO orders VALUES (2)", json!([])).await;
    assert_eq!(
        rows(&router, "SELECT count(*) FROM orders").await,
        json!([[2]])
    );
    // And inside a batch, which runs on the writer in one transaction.
    let reply = batch(
        &router,
        &[],
        &[
            "INSERT INTO orders VALUES (3)",
            "CREATE TABLE temp.orders (id INTEGER)",
        ],
    )
    .await;
    assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED");
    assert_eq!(
        rows(&router, "SELECT count(*) FROM orders").await,
        json!([[2]])
    );
}

/// The namespace rule holds for the new name too (ALTER TABLE ... RENAME TO) and for every name
/// a statement gives (a trigger's, an index's), however it is quoted or cased.
#[tokio::test]
async fn names_in_the_server_namespace_are_refused_old_and_new() {
    let router = memory_app();
    ok(&router, "CREATE TABLE t (v)", json!([])).await;
    all_refused(
        &router,
        &[
            "ALTER TABLE t RENAME TO _sqlhttp_mine",
            "ALTER TABLE main.t RENAME TO \"_SQLHTTP_mine\"",
            "ALTER TABLE t RENAME TO [_SqlHttp_mine]",
            "ALTER TABLE t RENAME TO `_sqlhttpmine`",
            "ALTER TABLE t RENAME TO '_sqlhttp_mine'",
            "/* a */ ALTER /* b */ TABLE -- c\n t RENAME /* d */ TO _sqlhttp_mine",
            "CREATE TRIGGER _sqlhttp_x AFTER INSERT ON t BEGIN SELECT 1; END",
            "CREATE TRIGGER \"_SQLHTTP_x\" AFTER INSERT ON t BEGIN SELECT 1; END",
            "CREATE INDEX _sqlhttp_i ON t (v)",
            "CREATE VIEW _sqlhttp_v AS SELECT 1",
            "CREATE TABLE _sqlhttpx (a)",
            "CREATE VIRTUAL TABLE _sqlhttp_r USING rtree(id, a, b)",
            "CREATE INDEX i ON _sqlhttp_idempotency (status)",
        ],
    )
    .await;
    assert_eq!(rows(&router, RESERVED_OBJECTS).await, server_objects_only());
    // Ordinary renames and the rest of ALTER TABLE still work.
    ok(&router, "ALTER TABLE t RENAME TO renamed", json!([])).await;
    ok(&router, "ALTER TABLE renamed RENAME v TO w", json!([])).await;
    ok(&router, "ALTER TABLE renamed ADD COLUMN x", json!([])).await;
    ok(&router, "ALTER TABLE renamed DROP COLUMN x", json!([])).await;
    ok(
        &router,
        "ALTER TABLE renamed RENAME TO \"sqlhttp_is_fine\"",
        json!([]),
    )
    .await;
    ok(
        &router,
        "CREATE TRIGGER audit AFTER INSERT ON sqlhttp_is_fine BEGIN SELECT 1; END",
        json!([]),
    )
    .await;
    assert_eq!(
        rows(&router, "SELECT name FROM sqlite_schema ORDER BY name").await,
        json!([
            ["_sqlhttp_idempotency"],
            ["_sqlhttp_idempotency_created_at"],
            ["audit"],
            ["sqlhttp_is_fine"]
        ])
    );
}

/// The store's rows, size and layout are not the clients' to see.
#[tokio::test]
async fn the_stores_rows_size_and_layout_cannot_be_read() {
    let router = memory_app();
    ok(&router, "CREATE TABLE t (v)", json!([])).await;
    all_refused(
        &router,
        &[
            "SELECT * FROM dbstat",
            "SELECT name, pgsize FROM dbstat WHERE name = '_sqlhttp_idempotency'",
            "SELECT * FROM DBSTAT('main')",
            "CREATE VIRTUAL TABLE stats USING dbstat",
            "CREATE VIRTUAL TABLE stats USING DbStat(main)",
            "SELECT count(*) FROM _sqlhttp_idempotency",
            "PRAGMA table_info(_sqlhttp_idempotency)",
            "PRAGMA table_xinfo('_SQLHTTP_IDEMPOTENCY')",
            "PRAGMA index_list(_sqlhttp_idempotency)",
            "PRAGMA index_info(_sqlhttp_idempotency_created_at)",
            "PRAGMA index_xinfo(\"_sqlhttp_idempotency_created_at\")",
            "PRAGMA foreign_key_list(_sqlhttp_idempotency)",
            "PRAGMA integrity_check(_sqlhttp_idempotency)",
            "SELECT * FROM pragma_table_info('_sqlhttp_idempotency')",
            "SELECT * FROM pragma_index_list('_sqlhttp_idempotency')",
        ],
    )
    .await;
    // Introspection of the client's own tables is as before.
    for allowed in [
        "PRAGMA table_info(t)",
        "SELECT name FROM pragma_table_info('t')",
        "PRAGMA integrity_check(t)",
        "PRAGMA page_count",
    ] {
        ok(&router, allowed, json!([])).await;
    }
}
