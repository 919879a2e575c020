//! Idempotency-Key semantics in-process: replay with the same body, 422 on a different body,
//! stored 4xx outcomes, unstored 5xx outcomes, TTL expiry, the off switch and key syntax. The
//! cases that hold for both engines run on both (see [`crate::engines`]); the rest are SQLite's.

use std::time::Duration;

use serde_json::{Value, json};
use sqlhttp_server::{AppState, Config, app};

use crate::common::{Reply, TempDb, app_with, memory_app, ok, post_with, send, sql};
use crate::engines::{Engine, engine_app, on_both_engines};

on_both_engines!(
    a_repeat_replays_the_stored_outcome_and_runs_once,
    the_same_key_with_a_different_body_is_422,
    malformed_keys_are_bad_request,
    transaction_control_cannot_carry_a_key,
    final_client_errors_are_stored_and_replayed,
    keys_expire_after_the_ttl,
    replicas_on_one_database_share_the_store,
);

on_both_engines!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_keyed_write_whose_requester_left_is_applied_once_when_sent_again,
);

fn body(sql: &str, params: &Value) -> Value {
    json!({"sql": sql, "params": params})
}

async fn keyed(router: &axum::Router, key: &str, body: &Value) -> Reply {
    post_with(router, &[("idempotency-key", key)], body).await
}

async fn count(router: &axum::Router) -> Value {
    ok(router, "SELECT count(*) FROM t", json!([])).await["rows"][0][0].clone()
}

async fn a_repeat_replays_the_stored_outcome_and_runs_once(engine: Engine) {
    let router = engine_app!(engine);
    // An id the engine assigns: a run again would answer another one.
    let id = engine.pick(
        "id INTEGER PRIMARY KEY",
        "id integer PRIMARY KEY GENERATED ALWAYS AS IDENTITY",
    );
    ok(
        &router,
        &format!("CREATE TABLE t ({id}, v TEXT)"),
        json!([]),
    )
    .await;
    let insert = body("INSERT INTO t (v) VALUES (?) RETURNING id", &json!(["a"]));

    let first = keyed(&router, "key-1", &insert).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("idempotent-replayed"), None);

    let second = keyed(&router, "key-1", &insert).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(second.header("content-type"), Some("application/json"));
    assert_eq!(second.body, first.body);
    assert_eq!(count(&router).await, 1);

    let other_key = keyed(&router, "key-2", &insert).await;
    assert_eq!(other_key.status, 200);
    assert_eq!(other_key.header("idempotent-replayed"), None);
    assert_eq!(count(&router).await, 2);
}

async fn the_same_key_with_a_different_body_is_422(engine: Engine) {
    let router = engine_app!(engine);
    ok(&router, "CREATE TABLE t (v INTEGER)", json!([])).await;
    let first = keyed(&router, "k", &body("INSERT INTO t VALUES (?)", &json!([1]))).await;
    assert_eq!(first.status, 200);
    let reused = keyed(&router, "k", &body("INSERT INTO t VALUES (?)", &json!([2]))).await;
    assert_eq!(reused.status, 422);
    assert_eq!(reused.code(), "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(count(&router).await, 1);
}

async fn final_client_errors_are_stored_and_replayed(engine: Engine) {
    let router = engine_app!(engine);
    ok(
        &router,
        "CREATE TABLE t (id INTEGER PRIMARY KEY)",
        json!([]),
    )
    .await;
    ok(&router, "INSERT INTO t VALUES (1)", json!([])).await;
    let duplicate = body("INSERT INTO t VALUES (1)", &json!([]));
    let first = keyed(&router, "dup", &duplicate).await;
    assert_eq!(first.status, 409);
    assert_eq!(first.code(), "CONSTRAINT_VIOLATION");
    ok(&router, "DELETE FROM t", json!([])).await;
    let replay = keyed(&router, "dup", &duplicate).await;
    assert_eq!(
        replay.status, 409,
        "the stored verdict is replayed, not re-run"
    );
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_eq!(count(&router).await, 0);

    let typo = body("INSERT INTO nope VALUES (1)", &json!([]));
    assert_eq!(keyed(&router, "typo", &typo).await.status, 400);
    let replay = keyed(&router, "typo", &typo).await;
    assert_eq!(replay.status, 400);
    assert_eq!(replay.code(), "SQL_ERROR");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    // An error the statement meets while it runs is stored too, and nothing of it is kept.
    let failing = body(
        engine.pick(
            "INSERT INTO t VALUES (abs(-9223372036854775807 - 1))",
            "INSERT INTO t VALUES (1/0)",
        ),
        &json!([]),
    );
    let first = keyed(&router, "runtime", &failing).await;
    assert_eq!(first.code(), "SQL_ERROR");
    let replay = keyed(&router, "runtime", &failing).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_eq!(count(&router).await, 0);
}

#[tokio::test]
async fn a_partially_applied_statement_leaves_no_effects_when_its_error_is_stored() {
    let router = memory_app();
    ok(
        &router,
        "CREATE TABLE t (id INTEGER PRIMARY KEY)",
        json!([]),
    )
    .await;
    ok(&router, "INSERT INTO t VALUES (3)", json!([])).await;
    // OR FAIL keeps rows 1 and 2 without a key; with a key the whole statement is undone.
    let reply = keyed(
        &router,
        "partial",
        &body("INSERT OR FAIL INTO t VALUES (1), (2), (3)", &json!([])),
    )
    .await;
    assert_eq!(reply.status, 409);
    assert_eq!(count(&router).await, 1);
}

#[tokio::test]
async fn unavailable_outcomes_are_not_stored() {
    let db = TempDb::new("idem-busy");
    let state = AppState::new(&Config {
        database: db.database(),
        ..Config::default()
    })
    .unwrap();
    let router = app(state);
    ok(&router, "CREATE TABLE t (v)", json!([])).await;

    let locker = rusqlite::Connection::open(db.path()).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let insert = body("INSERT INTO t VALUES (1)", &json!([]));
    let busy = keyed(&router, "retry-me", &insert).await;
    assert_eq!(busy.status, 503);
    assert_eq!(busy.code(), "UNAVAILABLE");
    assert_eq!(busy.header("retry-after"), Some("1"));
    locker.execute_batch("ROLLBACK").unwrap();

    let retried = keyed(&router, "retry-me", &insert).await;
    assert_eq!(retried.status, 200);
    assert_eq!(retried.header("idempotent-replayed"), None);
    assert_eq!(count(&router).await, 1);
}

async fn keys_expire_after_the_ttl(engine: Engine) {
    let router = engine_app!(engine, |config| {
        config.idempotency_ttl = Some(Duration::from_millis(1));
    });
    ok(&router, "CREATE TABLE t (v INTEGER)", json!([])).await;
    let first = keyed(&router, "k", &body("INSERT INTO t VALUES (1)", &json!([]))).await;
    assert_eq!(first.status, 200);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let after = keyed(&router, "k", &body("INSERT INTO t VALUES (2)", &json!([]))).await;
    assert_eq!(after.status, 200, "an expired key is free again");
    assert_eq!(after.header("idempotent-replayed"), None);
    assert_eq!(count(&router).await, 2);
}

#[tokio::test]
async fn the_off_switch_ignores_keys() {
    let router = app_with(&Config {
        idempotency_ttl: None,
        ..Config::default()
    });
    ok(&router, "CREATE TABLE t (v)", json!([])).await;
    let insert = body("INSERT INTO t VALUES (1)", &json!([]));
    for key in ["k", "k", "not a valid key"] {
        let reply = keyed(&router, key, &insert).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("idempotent-replayed"), None);
    }
    assert_eq!(count(&router).await, 3);
    // The store's name stays the server's, so no client can plant a table under it for the
    // day idempotency is switched back on.
    let planted = sql(&router, "CREATE TABLE _sqlhttp_idempotency (x)", json!([])).await;
    assert_eq!(planted.status, 403);
    assert_eq!(planted.code(), "STATEMENT_NOT_ALLOWED");
}

async fn malformed_keys_are_bad_request(engine: Engine) {
    let router = engine_app!(engine);
    let select = body("SELECT 1", &json!([]));
    let long = "k".repeat(256);
    for key in ["", "has space", long.as_str(), "caf\u{e9}"] {
        let reply = send(
            &router,
            "POST",
            "/api/v1/sql",
            &[
                ("idempotency-key", key),
                ("content-type", "application/json"),
            ],
            select.to_string(),
        )
        .await;
        assert_eq!(reply.status, 400, "{key:?}");
        assert_eq!(reply.code(), "BAD_REQUEST", "{key:?}");
    }
    let longest = "k".repeat(255);
    assert_eq!(keyed(&router, &longest, &select).await.status, 200);
    assert_eq!(keyed(&router, "!~", &select).await.status, 200);
}

async fn transaction_control_cannot_carry_a_key(engine: Engine) {
    let router = engine_app!(engine);
    for statement in [
        "BEGIN",
        "commit",
        "-- c\nROLLBACK",
        "SAVEPOINT s",
        "RELEASE s",
        "END",
    ] {
        let reply = keyed(&router, "tx", &body(statement, &json!([]))).await;
        assert_eq!(reply.status, 400, "{statement}");
        assert_eq!(reply.code(), "BAD_REQUEST", "{statement}");
    }
}

#[tokio::test]
async fn clients_cannot_reach_the_store_and_keyed_writes_stay_exactly_once() {
    let router = memory_app();
    ok(&router, "CREATE TABLE t (v)", json!([])).await;
    let insert = body("INSERT INTO t VALUES (1)", &json!([]));
    assert_eq!(keyed(&router, "kept", &insert).await.status, 200);
    for attack in [
        "SELECT * FROM _sqlhttp_idempotency",
        "DELETE FROM _sqlhttp_idempotency",
        "UPDATE _sqlhttp_idempotency SET request_hash = x'00'",
        "DROP TABLE _sqlhttp_idempotency",
        "ALTER TABLE _sqlhttp_idempotency RENAME TO gone",
        "DROP INDEX _sqlhttp_idempotency_created_at",
        "CREATE TRIGGER wipe AFTER INSERT ON _sqlhttp_idempotency BEGIN DELETE FROM _sqlhttp_idempotency; END",
        "CREATE VIEW peek AS SELECT * FROM _SQLHTTP_IDEMPOTENCY",
        "INSERT INTO main._sqlhttp_idempotency VALUES ('x', x'00', 200, x'00', 0)",
    ] {
        let reply = sql(&router, attack, json!([])).await;
        // A view over the store can be created but not read; everything else is refused.
        if attack.starts_with("CREATE VIEW") {
            let peek = sql(&router, "SELECT * FROM peek", json!([])).await;
            assert_eq!(peek.code(), "STATEMENT_NOT_ALLOWED", "{attack}");
            continue;
        }
        assert_eq!(reply.status, 403, "{attack}");
        assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{attack}");
    }
    let replay = keyed(&router, "kept", &insert).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(count(&router).await, 1);
}

/// Replicas of one server on one database share its store: one applies a keyed write, the
/// other replays it.
async fn replicas_on_one_database_share_the_store(engine: Engine) {
    let Some(database) = engine.shared_database().await else {
        return;
    };
    let a = database.app(|_| {});
    let b = database.app(|_| {});
    ok(&a, "CREATE TABLE t (x int)", json!([])).await;
    let body = json!({"sql": "INSERT INTO t VALUES (1)"});
    let key = [("idempotency-key", "shared")];
    let (first, second) = tokio::join!(post_with(&a, &key, &body), post_with(&b, &key, &body));
    // One replica applies; the other replays, or (while the first still runs) answers 409
    // IDEMPOTENCY_KEY_IN_USE, as one replica's in-flight registry would.
    let fresh = [&first, &second]
        .iter()
        .filter(|r| r.status == 200 && r.header("idempotent-replayed").is_none())
        .count();
    assert_eq!(fresh, 1, "exactly one replica applied the write");
    for reply in [&first, &second] {
        if reply.status != 200 {
            assert_eq!(reply.code(), "IDEMPOTENCY_KEY_IN_USE");
            assert_eq!(reply.header("retry-after"), Some("1"));
        }
    }
    for replica in [&a, &b] {
        let again = post_with(replica, &key, &body).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
    }
    let count = ok(&b, "SELECT count(*) FROM t", json!([])).await;
    assert_eq!(count["rows"], json!([[1]]));
}

/// A keyed write whose requester left while it ran (a client's timeout, its answer lost in a
/// gateway) and that comes again with its key, to the same server and to another one on the
/// same database: the statement was stopped and nothing of it kept, no failure was stored for
/// it, and the second attempt applies it once; a third replays that outcome. While the gate
/// row exists the write runs for minutes; the gate is removed before it is sent again.
async fn a_keyed_write_whose_requester_left_is_applied_once_when_sent_again(engine: Engine) {
    let Some(database) = engine.shared_database().await else {
        return;
    };
    let a = database.app(|_| {});
    let b = database.app(|_| {});
    ok(&a, "CREATE TABLE t (v text)", json!([])).await;
    ok(&a, "CREATE TABLE gate (g int)", json!([])).await;
    ok(&a, "INSERT INTO gate VALUES (1)", json!([])).await;
    // Long only while the gate stands: SQLite counts to two billion, PostgreSQL sleeps.
    let slow_while_gated = engine.pick(
        "(CASE WHEN EXISTS (SELECT 1 FROM gate) THEN (WITH RECURSIVE g(n) AS (SELECT 1 \
         UNION ALL SELECT n + 1 FROM g WHERE n < 2000000000) SELECT count(*) FROM g) ELSE 0 END) \
         >= 0",
        "(SELECT count(*) FROM (SELECT pg_sleep(CASE WHEN EXISTS (SELECT 1 FROM gate) THEN 120 \
         ELSE 0 END)) AS slept) = 1",
    );
    let write = body(
        &format!("INSERT INTO t (v) SELECT ? WHERE {slow_while_gated}"),
        &json!(["once"]),
    );
    let key = "requester-left-then-again";

    let left = tokio::time::timeout(Duration::from_millis(500), keyed(&a, key, &write)).await;
    assert!(
        left.is_err(),
        "the gated write answered before its requester left"
    );
    // The gate goes: this waits for the write lock if the stopped write still held it.
    ok(&a, "DELETE FROM gate", json!([])).await;
    assert_eq!(
        count(&a).await,
        0,
        "the write whose requester left was kept"
    );

    // Sent again, to the other server: applied now, once. While the first attempt is still
    // being stopped the key may be in use; a client waits as told and sends it again.
    let started = std::time::Instant::now();
    let again = loop {
        let reply = keyed(&b, key, &write).await;
        if reply.status == 409 && started.elapsed() < Duration::from_secs(10) {
            assert_eq!(reply.code(), "IDEMPOTENCY_KEY_IN_USE");
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        break reply;
    };
    assert_eq!(
        again.status,
        200,
        "{engine:?}: the second attempt: {}",
        String::from_utf8_lossy(&again.body)
    );
    assert_eq!(again.header("idempotent-replayed"), None);
    assert_eq!(count(&a).await, 1);

    // A third attempt, to either server, replays the second's outcome.
    for server in [&a, &b] {
        let replay = keyed(server, key, &write).await;
        assert_eq!(replay.status, 200);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.body, again.body);
    }
    assert_eq!(count(&b).await, 1);
}

/// A keyed request's identity as the durable store keeps it, pinned byte for byte: SHA-256 of
/// the body as sent on `/api/v1/sql`, of `/api/v1/batch`, a newline and the body on a batch. A
/// request whose answer was lost is re-sent to a server of another version (a rolling upgrade,
/// a restart onto a new binary) and must be recognised as the same request: a change here would
/// answer it 422, or run it twice once the old record expired. Changing the format needs an ADR
/// and a migration of stored keys.
#[tokio::test]
async fn a_keyed_requests_identity_is_stable_across_versions() {
    let db = TempDb::new("idem-identity");
    let router = app_with(&Config {
        database: db.database(),
        ..Config::default()
    });
    ok(&router, "CREATE TABLE t (v)", json!([])).await;
    let keyed_bytes = |path: &'static str, key: &'static str, body: &'static str| {
        let router = router.clone();
        async move {
            send(
                &router,
                "POST",
                path,
                &[
                    ("content-type", "application/json"),
                    ("idempotency-key", key),
                ],
                body.to_owned(),
            )
            .await
        }
    };
    let statement = keyed_bytes(
        "/api/v1/sql",
        "identity-sql",
        r#"{"sql":"INSERT INTO t VALUES (1)","params":[]}"#,
    )
    .await;
    assert_eq!(statement.status, 200);
    let batch = keyed_bytes(
        "/api/v1/batch",
        "identity-batch",
        r#"{"statements":[{"sql":"INSERT INTO t VALUES (2)"}]}"#,
    )
    .await;
    assert_eq!(batch.status, 200);

    let store = rusqlite::Connection::open(db.path()).unwrap();
    let stored = |key: &str| -> String {
        let hash: Vec<u8> = store
            .query_row(
                "SELECT request_hash FROM _sqlhttp_idempotency WHERE key = ?1",
                [key],
                |row| row.get(0),
            )
            .unwrap();
        hash.iter().map(|b| format!("{b:02x}")).collect()
    };
    assert_eq!(
        stored("identity-sql"),
        "74cbe94f6e00e0b8abcd892ded9b62d8a7c56c885aee3ca15f9594f4a1a427bf"
    );
    assert_eq!(
        stored("identity-batch"),
        "e09f9f787f00ff826637317335db3b93a11f662b8e60dc187e0d842909fa552e"
    );
}
