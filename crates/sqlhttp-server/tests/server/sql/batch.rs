//! Atomic batches (`POST /api/v1/batch`) in-process and over TCP: the success and error shapes,
//! all-or-nothing, read-only batches, limits, keyed replay, the sandbox inside batches, and
//! cancellation when the client goes away. The cases that hold for both engines run on both
//! (see [`crate::engines`]).

use std::time::Duration;

use axum::Router;
use serde_json::{Value, json};
use sqlhttp_server::{Config, Limits, Server};

use crate::common::{Reply, app_with, batch_with, memory_app, ok, post_json, send, without_stats};
use crate::engines::{Engine, engine_app, needs_postgres, on_both_engines, postgres_app};

on_both_engines!(
    each_result_is_exactly_the_v1_body_of_its_statement,
    a_failure_in_the_last_statement_rolls_back_everything_and_names_it,
    a_read_only_batch_reads_and_refuses_a_write_with_nothing_applied,
    limits_on_statements_and_bytes,
    a_keyed_batch_applies_once_and_replays_its_outcome,
    a_batch_runs_at_the_isolation_it_asks_for,
);

const BATCH: &str = "/api/v1/batch";

async fn batch(router: &Router, body: &Value) -> Reply {
    batch_with(router, &[], body).await
}

fn statements(sqls: &[&str]) -> Value {
    json!({ "statements": sqls.iter().map(|sql| json!({ "sql": sql })).collect::<Vec<_>>() })
}

async fn accounts(router: &Router) -> Value {
    ok(
        router,
        "SELECT id, balance FROM accounts ORDER BY id",
        json!([]),
    )
    .await["rows"]
        .clone()
}

/// An app on `engine` with two accounts, 100 and 0, whose balance may not go below zero; `None`
/// when there is no PostgreSQL.
async fn with_accounts(engine: Engine) -> Option<Router> {
    let router = engine.app(|_| {}).await?;
    ok(
        &router,
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0))",
        json!([]),
    )
    .await;
    ok(
        &router,
        "INSERT INTO accounts VALUES (1, 100), (2, 0)",
        json!([]),
    )
    .await;
    Some(router)
}

/// The app of [`with_accounts`], or `return` from the case when there is no PostgreSQL.
macro_rules! with_accounts {
    ($engine:expr) => {
        match with_accounts($engine).await {
            Some(router) => router,
            None => return,
        }
    };
}

fn transfer(amount: i64) -> Value {
    json!({ "statements": [
        { "sql": "UPDATE accounts SET balance = balance - ? WHERE id = 1", "params": [amount] },
        { "sql": "UPDATE accounts SET balance = balance + ? WHERE id = 2", "params": [amount] },
        { "sql": "SELECT sum(balance) AS total FROM accounts" },
    ]})
}

async fn each_result_is_exactly_the_v1_body_of_its_statement(engine: Engine) {
    let router = with_accounts!(engine);
    let reply = batch(&router, &transfer(30)).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.header("content-type"), Some("application/json"));
    // An expression's type: none on SQLite, `sum(integer)`'s on PostgreSQL.
    let total = engine.pick("", "int8");
    assert_eq!(
        without_stats(&String::from_utf8(reply.body).unwrap()),
        format!(
            concat!(
                r#"{{"results":["#,
                r#"{{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":null}},"#,
                r#"{{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":null}},"#,
                r#"{{"columns":[{{"name":"total","type":"{total}"}}],"rows":[[100]],"rows_affected":0,"last_insert_id":null}}"#,
                "]}}"
            ),
            total = total
        )
    );
    assert_eq!(accounts(&router).await, json!([[1, 70], [2, 30]]));
    // A statement sees what the statements before it in the batch wrote.
    let reply = batch(
        &router,
        &statements(&[
            "UPDATE accounts SET balance = balance - 5 WHERE id = 1",
            "SELECT id, balance FROM accounts ORDER BY id",
        ]),
    )
    .await;
    assert_eq!(
        reply.json()["results"][1]["rows"],
        json!([[1, 65], [2, 30]])
    );
}

async fn a_failure_in_the_last_statement_rolls_back_everything_and_names_it(engine: Engine) {
    let router = with_accounts!(engine);
    let body = json!({ "statements": [
        { "sql": "UPDATE accounts SET balance = balance + 50 WHERE id = 2" },
        { "sql": "INSERT INTO accounts VALUES (3, 10)" },
        { "sql": "UPDATE accounts SET balance = balance - ? WHERE id = 1", "params": [500] },
    ]});
    let reply = batch(&router, &body).await;
    assert_eq!(reply.status, 409);
    let error = &reply.json()["error"];
    assert_eq!(error["code"], "CONSTRAINT_VIOLATION");
    assert_eq!(error["constraint"], "check");
    assert_eq!(error["statement"], 2);
    assert_eq!(accounts(&router).await, json!([[1, 100], [2, 0]]));

    let reply = batch(&router, &statements(&["SELECT 1", "SELEC 2", "SELECT 3"])).await;
    assert_eq!((reply.status, reply.code()), (400, "SQL_ERROR".to_owned()));
    assert_eq!(reply.json()["error"]["statement"], 1);
}

async fn a_read_only_batch_reads_and_refuses_a_write_with_nothing_applied(engine: Engine) {
    let router = with_accounts!(engine);
    let reads = json!({ "read_only": true, "statements": [
        { "sql": "SELECT balance FROM accounts WHERE id = ?", "params": [1] },
        { "sql": "SELECT count(*) FROM accounts" },
    ]});
    let reply = batch(&router, &reads).await;
    assert_eq!(reply.status, 200);
    let results = reply.json()["results"].clone();
    assert_eq!(results[0]["rows"], json!([[100]]));
    assert_eq!(results[1]["rows"], json!([[2]]));

    let mut write = transfer(10);
    write["read_only"] = json!(true);
    let reply = batch(&router, &write).await;
    assert_eq!(reply.status, 403);
    assert_eq!(reply.code(), "READ_ONLY");
    assert_eq!(reply.json()["error"]["statement"], 0);
    assert_eq!(accounts(&router).await, json!([[1, 100], [2, 0]]));
}

async fn limits_on_statements_and_bytes(engine: Engine) {
    let router = engine_app!(engine, |config| {
        config.max_body_bytes = 200;
        config.max_batch_bytes = 1_000;
        config.limits.max_batch_statements = 3;
    });
    let four = batch(&router, &statements(&["SELECT 1"; 4])).await;
    assert_eq!(
        (four.status, four.code()),
        (413, "PAYLOAD_TOO_LARGE".to_owned())
    );
    assert!(
        four.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-batch-statements")
    );
    // Over the single-statement body limit, within the batch limit.
    let padded = format!("SELECT '{}'", "x".repeat(300));
    let reply = batch(&router, &statements(&[&padded])).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let large = format!("SELECT '{}'", "x".repeat(1_000));
    let reply = batch(&router, &statements(&[&large])).await;
    assert_eq!(reply.status, 413);

    for body in [json!({}), json!({ "statements": [] }), json!([])] {
        let reply = batch(&router, &body).await;
        assert_eq!(
            (reply.status, reply.code()),
            (400, "BAD_REQUEST".to_owned()),
            "{body}"
        );
    }
    let reply = batch(
        &router,
        &json!({ "statements": [{ "sql": "SELECT 1" }, { "sql": 7 }] }),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["statement"], 1);
}

#[tokio::test]
async fn the_endpoint_speaks_the_protocol_like_the_sql_endpoint() {
    let router = app_with(&Config {
        tokens: vec!["s3cret".into()],
        ..Config::default()
    });
    let body = statements(&["SELECT 1"]).to_string();
    let unauthenticated = send(
        &router,
        "POST",
        BATCH,
        &[("content-type", "application/json")],
        body.clone(),
    )
    .await;
    assert_eq!(unauthenticated.status, 401);
    let auth = ("authorization", "Bearer s3cret");
    let plain = send(
        &router,
        "POST",
        BATCH,
        &[auth, ("content-type", "text/plain")],
        body.clone(),
    )
    .await;
    assert_eq!(plain.status, 415);
    let get = send(&router, "GET", BATCH, &[auth], "").await;
    assert_eq!((get.status, get.header("allow")), (405, Some("POST")));
    let fine = send(
        &router,
        "POST",
        BATCH,
        &[auth, ("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(fine.status, 200);
}

#[tokio::test]
async fn the_sandbox_holds_inside_a_batch() {
    let router = with_accounts!(Engine::Sqlite);
    let first = "UPDATE accounts SET balance = 0";
    let cases = [
        ("BEGIN", 400, "BAD_REQUEST"),
        ("COMMIT", 400, "BAD_REQUEST"),
        ("SAVEPOINT s", 400, "BAD_REQUEST"),
        ("ATTACH 'elsewhere.db' AS x", 403, "STATEMENT_NOT_ALLOWED"),
        ("PRAGMA foreign_keys = OFF", 403, "STATEMENT_NOT_ALLOWED"),
        (
            "SELECT * FROM _sqlhttp_idempotency",
            403,
            "STATEMENT_NOT_ALLOWED",
        ),
        (
            "DELETE FROM _sqlhttp_idempotency",
            403,
            "STATEMENT_NOT_ALLOWED",
        ),
        ("CREATE TEMP TABLE t (x)", 403, "STATEMENT_NOT_ALLOWED"),
        ("VACUUM", 403, "STATEMENT_NOT_ALLOWED"),
    ];
    for (refused, status, code) in cases {
        let reply = batch(&router, &statements(&[first, refused])).await;
        assert_eq!(
            (reply.status, reply.code()),
            (status, code.to_owned()),
            "{refused}"
        );
        assert_eq!(reply.json()["error"]["statement"], 1, "{refused}");
    }
    assert_eq!(accounts(&router).await, json!([[1, 100], [2, 0]]));
}

async fn a_keyed_batch_applies_once_and_replays_its_outcome(engine: Engine) {
    let router = with_accounts!(engine);
    let key = ("idempotency-key", "transfer-1");
    let first = batch_with(&router, &[key], &transfer(10)).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = batch_with(&router, &[key], &transfer(10)).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(accounts(&router).await, json!([[1, 90], [2, 10]]));

    let other = batch_with(&router, &[key], &transfer(20)).await;
    assert_eq!(
        (other.status, other.code()),
        (422, "IDEMPOTENCY_KEY_REUSED".to_owned())
    );
    // The same bytes under the same key on the single-statement endpoint are another request.
    let both = json!({ "sql": "SELECT 1", "statements": [{ "sql": "SELECT 1" }] });
    let shared = ("idempotency-key", "shared");
    assert_eq!(batch_with(&router, &[shared], &both).await.status, 200);
    let single = send(
        &router,
        "POST",
        "/api/v1/sql",
        &[("content-type", "application/json"), shared],
        both.to_string(),
    )
    .await;
    assert_eq!(
        single.status,
        422,
        "{}",
        String::from_utf8_lossy(&single.body)
    );

    // A final failure is stored with its statement index, and nothing of it applied.
    let overdraw = ("idempotency-key", "transfer-2");
    let refused = batch_with(&router, &[overdraw], &transfer(1_000)).await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.json()["error"]["statement"], 0);
    let replayed = batch_with(&router, &[overdraw], &transfer(1_000)).await;
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    assert_eq!(replayed.body, refused.body);
    assert_eq!(accounts(&router).await, json!([[1, 90], [2, 10]]));

    // A read-only batch has nothing to apply once: its key is ignored.
    let reads = json!({ "read_only": true, "statements": [{ "sql": "SELECT 1" }] });
    for _ in 0..2 {
        let reply = batch_with(&router, &[("idempotency-key", "read")], &reads).await;
        assert_eq!(
            (reply.status, reply.header("idempotent-replayed")),
            (200, None)
        );
    }
}

#[tokio::test]
async fn a_client_that_goes_away_rolls_its_batch_back() {
    let handle = Server::bind(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        limits: Limits {
            statement_timeout: Duration::from_secs(120),
            ..Limits::default()
        },
        ..Config::default()
    })
    .await
    .unwrap()
    .spawn();
    let url = handle.url();
    let post = |path: &'static str, body: Value| {
        let url = url.clone();
        async move { post_json(&url, path, &body).await }
    };
    assert_eq!(
        post("/api/v1/sql", json!({ "sql": "CREATE TABLE t (x)" }))
            .await
            .0,
        200
    );
    let endless = "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        post(BATCH, statements(&["INSERT INTO t VALUES (1)", endless])),
    )
    .await;
    assert!(abandoned.is_err(), "the batch was still running");
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(10),
        post("/api/v1/sql", json!({ "sql": "INSERT INTO t VALUES (2)" })),
    )
    .await
    .expect("the writer was released");
    assert_eq!(status, 200);
    let (_, count) = post("/api/v1/sql", json!({ "sql": "SELECT count(*) FROM t" })).await;
    assert_eq!(
        count["rows"],
        json!([[1]]),
        "the abandoned batch was rolled back"
    );
    handle.shutdown().await;
}

/// `foreign_keys: checked_at_commit` on SQLite: no `ON DELETE` action fires while the
/// statements run (a table rebuild keeps the rows that refer to it), every key is checked
/// before the commit (a row left referring to nothing fails the batch, nothing applied, with
/// or without a key), and the next statement runs with foreign keys enforced again.
#[tokio::test]
async fn foreign_keys_checked_at_commit_let_a_table_be_rebuilt() {
    let router = memory_app();
    for sql in [
        "CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT)",
        "CREATE TABLE posts (id INTEGER PRIMARY KEY, author INTEGER REFERENCES authors ON DELETE CASCADE)",
        "INSERT INTO authors VALUES (1, 'ann')",
        "INSERT INTO posts VALUES (10, 1), (11, 1)",
    ] {
        ok(&router, sql, json!([])).await;
    }
    let rebuild = [
        "CREATE TABLE authors_new (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
        "INSERT INTO authors_new SELECT id, name FROM authors",
        "DROP TABLE authors",
        "ALTER TABLE authors_new RENAME TO authors",
    ];
    let mut body = statements(&rebuild);
    body["foreign_keys"] = json!("checked_at_commit");
    let rebuilt = batch(&router, &body).await;
    assert_eq!(rebuilt.status, 200, "{}", rebuilt.json());
    let posts = ok(&router, "SELECT count(*) FROM posts", json!([])).await;
    assert_eq!(posts["rows"], json!([[2]]), "the rebuild cascaded");

    // Enforced again: an orphan is refused at once.
    let orphan = crate::common::sql(&router, "INSERT INTO posts VALUES (12, 99)", json!([])).await;
    assert_eq!(orphan.status, 409, "{}", orphan.json());

    // A batch that leaves an orphan is refused at commit, whole, keyed or not.
    for key in [None, Some("fk-check-1")] {
        let mut body = statements(&[
            "CREATE TABLE gone (x INTEGER)",
            "DELETE FROM authors WHERE id = 1",
        ]);
        body["foreign_keys"] = json!("checked_at_commit");
        let headers: Vec<(&str, &str)> = key.iter().map(|k| ("idempotency-key", *k)).collect();
        let refused = batch_with(&router, &headers, &body).await;
        assert_eq!(refused.status, 409, "{}", refused.json());
        assert_eq!(refused.json()["error"]["constraint"], "foreign_key");
        let tables = ok(
            &router,
            "SELECT count(*) FROM sqlite_schema WHERE name = 'gone'",
            json!([]),
        )
        .await;
        assert_eq!(tables["rows"], json!([[0]]), "nothing of it was applied");
    }
    // Without the option, the same rebuild cascades as SQLite does.
    let cascaded = batch(
        &router,
        &statements(&[
            "CREATE TABLE authors_old (id INTEGER PRIMARY KEY, name TEXT)",
            "INSERT INTO authors_old SELECT id, name FROM authors",
            "DROP TABLE authors",
            "ALTER TABLE authors_old RENAME TO authors",
        ]),
    )
    .await;
    assert_eq!(cascaded.status, 200, "{}", cascaded.json());
    let posts = ok(&router, "SELECT count(*) FROM posts", json!([])).await;
    assert_eq!(posts["rows"], json!([[0]]));
}

needs_postgres! {
    #[tokio::test]
    async fn foreign_keys_checked_at_commit_are_refused_on_postgres() {
        let router = postgres_app!(
            "foreign_keys_checked_at_commit_are_refused_on_postgres",
            |_| {}
        );
        let mut body = statements(&["CREATE TABLE t (x INTEGER)"]);
        body["foreign_keys"] = json!("checked_at_commit");
        let refused = batch(&router, &body).await;
        assert_eq!(refused.status, 400, "{}", refused.json());
        assert!(
            refused.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("PostgreSQL"),
            "{}",
            refused.json()
        );
        let none = ok(
            &router,
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename = 't'",
            json!([]),
        )
        .await;
        assert_eq!(none["rows"], json!([[0]]));
    }
}

/// `"isolation"` sets a batch's transaction level: every level on PostgreSQL (the defaults are
/// `READ COMMITTED` for a write and `REPEATABLE READ` for a read-only batch), `serializable`
/// only on SQLite, whose transactions all are; anything else is refused before it runs.
async fn a_batch_runs_at_the_isolation_it_asks_for(engine: Engine) {
    let router = with_accounts!(engine);
    let level = "SELECT current_setting('transaction_isolation') AS level";
    let asked = |isolation: Option<&str>, read_only: bool| {
        let mut body = json!({ "statements": [{ "sql": level }], "read_only": read_only });
        if let Some(isolation) = isolation {
            body["isolation"] = json!(isolation);
        }
        body
    };
    for bad in ["snapshot", "SERIALIZABLE", ""] {
        let reply = batch(&router, &asked(Some(bad), false)).await;
        assert_eq!(
            (reply.status, reply.code()),
            (400, "BAD_REQUEST".to_owned()),
            "{bad}"
        );
    }
    if engine == Engine::Sqlite {
        let body = json!({
            "statements": [{ "sql": "UPDATE accounts SET balance = balance - 1 WHERE id = 1" }],
            "isolation": "serializable",
        });
        assert_eq!(batch(&router, &body).await.status, 200);
        for level in ["repeatable_read", "read_committed"] {
            for read_only in [false, true] {
                let reply = batch(&router, &asked(Some(level), read_only)).await;
                assert_eq!(reply.status, 400, "{level}");
                assert!(
                    reply.json()["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("serializable only")
                );
            }
        }
        assert_eq!(accounts(&router).await, json!([[1, 99], [2, 0]]));
        return;
    }
    let seen = |reply: Reply| {
        assert_eq!(reply.status, 200, "{}", reply.json());
        reply.json()["results"][0]["rows"][0][0].clone()
    };
    for (isolation, read_only, expected) in [
        (None, false, "read committed"),
        (None, true, "repeatable read"),
        (Some("serializable"), false, "serializable"),
        (Some("serializable"), true, "serializable"),
        (Some("repeatable_read"), false, "repeatable read"),
        (Some("read_committed"), true, "read committed"),
    ] {
        let reply = batch(&router, &asked(isolation, read_only)).await;
        assert_eq!(
            seen(reply),
            json!(expected),
            "{isolation:?} read_only={read_only}"
        );
    }
    // A keyed batch too.
    let keyed = batch_with(
        &router,
        &[("idempotency-key", "isolated-1")],
        &asked(Some("serializable"), false),
    )
    .await;
    assert_eq!(seen(keyed), json!("serializable"));
}

needs_postgres! {
    /// On PostgreSQL, serializable batches that conflict (each reads and writes the same row) fail
    /// to serialize against each other; nothing of a failed one is kept, it is answered as
    /// unavailable, and the SDK runs it again under its key: every one ends applied exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conflicting_serializable_keyed_batches_each_apply_once_through_the_sdk() {
        let Some(url) = crate::engines::database(
            "conflicting_serializable_keyed_batches_each_apply_once_through_the_sdk",
        )
        .await
        else {
            return;
        };
        let server = crate::common::serve(crate::engines::config(&url)).await;
        let client = sqlhttp::Client::builder(server.url())
            .retry_writes(true)
            .retry(
                sqlhttp::RetryPolicy::new()
                    .with_max_attempts(30)
                    .with_initial_backoff(Duration::from_millis(5))
                    .with_max_backoff(Duration::from_millis(50)),
            )
            .build()
            .unwrap();
        client
            .execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
            .await
            .unwrap();
        client
            .execute("INSERT INTO counter VALUES (1, 0)")
            .await
            .unwrap();
        client
            .execute("CREATE TABLE seen (k INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
            .await
            .unwrap();
        let runs = (0..8).map(|k| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .batch()
                    .statement("INSERT INTO seen SELECT ?, n FROM counter WHERE id = 1")
                    .bind(k)
                    .statement("UPDATE counter SET n = n + 1 WHERE id = 1")
                    .isolation(sqlhttp::Isolation::Serializable)
                    .idempotency_key(format!("bump-{k}"))
                    .await
            })
        });
        for run in runs.collect::<Vec<_>>() {
            run.await.unwrap().unwrap();
        }
        let counter: Vec<(i64,)> = client
            .query("SELECT n FROM counter")
            .fetch_all()
            .await
            .unwrap();
        assert_eq!(counter, vec![(8,)], "each batch applied exactly once");
        // Serializable: each saw a different count, as if they ran one after another.
        let mut seen: Vec<(i64,)> = client
            .query("SELECT n FROM seen ORDER BY n")
            .fetch_all()
            .await
            .unwrap();
        seen.dedup();
        assert_eq!(seen.len(), 8, "{seen:?}");
    }
}
