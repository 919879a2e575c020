//! `POST /api/v1/describe/statement` on both engines: a statement's parameters, columns (with
//! their types and `NOT NULL` where it can be known) and whether it may write, with nothing run;
//! refused exactly as running the statement would be refused (the sandbox, the read-only
//! credential, PostgreSQL's privileges, the text's bounds).

use serde_json::{Value, json};

use crate::common::{READER, Reply, WRITER, ok, post_with, send, with_writer_and_reader};
use crate::engines::{Engine, engine_app, needs_postgres, on_both_engines};

on_both_engines!(
    describes_parameters_columns_and_writes,
    nothing_described_runs,
    a_describe_is_refused_as_running_would_be,
    a_read_credential_describes_reads_only,
);

/// Describes `sql` with `headers`.
async fn describe(router: &axum::Router, headers: &[(&str, &str)], sql: &str) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let body = json!({ "sql": sql }).to_string();
    send(router, "POST", "/api/v1/describe/statement", &all, body).await
}

/// The description of `sql`, which must be described.
async fn described(router: &axum::Router, sql: &str) -> Value {
    let reply = describe(router, &[], sql).await;
    assert_eq!(
        reply.status,
        200,
        "{sql}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()
}

async fn books(engine: Engine, router: &axum::Router) {
    let id = engine.pick(
        "INTEGER PRIMARY KEY",
        "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    );
    ok(
        router,
        &format!("CREATE TABLE books (id {id}, title TEXT NOT NULL, note TEXT)"),
        json!([]),
    )
    .await;
}

async fn describes_parameters_columns_and_writes(engine: Engine) {
    let router = engine_app!(engine);
    books(engine, &router).await;
    let read = described(
        &router,
        "SELECT id, title, note, length(title) AS n FROM books WHERE id = ? AND title <> ?",
    )
    .await;
    assert_eq!(
        read,
        json!({
            "params": engine.pick(
                json!([{"type": null}, {"type": null}]),
                json!([{"type": "int8"}, {"type": "text"}]),
            ),
            "columns": [
                {"name": "id", "type": engine.pick("INTEGER", "int8"), "nullable": false},
                {"name": "title", "type": engine.pick("TEXT", "text"), "nullable": false},
                {"name": "note", "type": engine.pick("TEXT", "text"), "nullable": null},
                {"name": "n", "type": engine.pick(Value::Null, json!("int4")), "nullable": null},
            ],
            "may_write": false,
        })
    );
    // An outer join and a compound select give NULL where a table column never holds one.
    for sql in [
        "SELECT b.title FROM books a LEFT JOIN books b ON a.id = b.id",
        "SELECT title FROM books UNION ALL SELECT NULL",
    ] {
        assert_eq!(
            described(&router, sql).await["columns"][0]["nullable"],
            Value::Null,
            "{sql}"
        );
    }
    let write = described(&router, "INSERT INTO books (title) VALUES (?) RETURNING id").await;
    assert_eq!(write["may_write"], true);
    assert_eq!(write["params"].as_array().unwrap().len(), 1);
    assert_eq!(write["columns"][0]["name"], "id");
    let ddl = described(&router, "CREATE TABLE more (x int)").await;
    assert_eq!(ddl, json!({"params": [], "columns": [], "may_write": true}));
}

async fn nothing_described_runs(engine: Engine) {
    let router = engine_app!(engine);
    books(engine, &router).await;
    for sql in [
        "INSERT INTO books (title) VALUES ('kept?')",
        "DELETE FROM books",
        "DROP TABLE books",
        "CREATE TABLE made (x int)",
    ] {
        described(&router, sql).await;
    }
    ok(
        &router,
        "INSERT INTO books (title) VALUES ('one')",
        json!([]),
    )
    .await;
    let rows = ok(&router, "SELECT title FROM books", json!([])).await;
    assert_eq!(rows["rows"], json!([["one"]]));
    let made = sql_reply(&router, "SELECT * FROM made").await;
    assert_eq!(made.status, 400, "the described CREATE TABLE did not run");
}

async fn sql_reply(router: &axum::Router, sql: &str) -> Reply {
    post_with(router, &[], &json!({ "sql": sql })).await
}

/// What a refusal says: its status and code.
fn refusal(reply: &Reply) -> (u16, String) {
    (reply.status, reply.code())
}

async fn a_describe_is_refused_as_running_would_be(engine: Engine) {
    let router = engine_app!(engine);
    let long = format!("SELECT '{}'", "x".repeat(2 * 1024 * 1024));
    for sql in [
        "SELECT * FROM no_such_table",
        "BEGIN",
        "VACUUM",
        "SELECT 1; SELECT 2",
        engine.pick(
            "SELECT * FROM _sqlhttp_idempotency",
            "SELECT * FROM _sqlhttp.idempotency",
        ),
        engine.pick("PRAGMA writable_schema = ON", "SET ROLE postgres"),
        long.as_str(),
    ] {
        let ran = sql_reply(&router, sql).await;
        let asked = describe(&router, &[], sql).await;
        assert!(ran.status >= 400, "{sql} runs");
        assert_eq!(refusal(&asked), refusal(&ran), "{:.60}", sql);
    }
}

async fn a_read_credential_describes_reads_only(engine: Engine) {
    let router = engine_app!(engine, with_writer_and_reader);
    let create = json!({"sql": "CREATE TABLE t (x int NOT NULL)"});
    assert_eq!(post_with(&router, &WRITER, &create).await.status, 200);
    let read = describe(&router, &READER, "SELECT x FROM t").await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json()["columns"][0]["nullable"], false);
    for sql in ["INSERT INTO t VALUES (1)", "DROP TABLE t"] {
        let asked = describe(&router, &READER, sql).await;
        let ran = post_with(&router, &READER, &json!({ "sql": sql })).await;
        assert_eq!(refusal(&asked), (403, "READ_ONLY".to_owned()), "{sql}");
        assert_eq!(refusal(&ran), refusal(&asked), "{sql}");
        let written = describe(&router, &WRITER, sql).await;
        assert_eq!(written.status, 200, "{sql}");
    }
    let unauthenticated = describe(&router, &[], "SELECT 1").await;
    assert_eq!(unauthenticated.status, 401);
}

needs_postgres! {
    /// PostgreSQL checks privileges when a statement's plan starts, not when it is parsed: a
    /// describe plans it (`EXPLAIN`, nothing run) as the client role, so a table the role may not
    /// read is refused, with the statement's own refusal, and its columns are not told.
    #[tokio::test]
    async fn a_table_the_client_role_may_not_read_is_not_described() {
        let Some(url) = crate::engines::database("describe_privileges").await else {
            return;
        };
        let router =
            sqlhttp_server::app(sqlhttp_server::AppState::new(&crate::engines::config(&url)).unwrap());
        ok(&router, "SELECT 1", json!([])).await;
        let owner = crate::engines::owner(&url).await;
        let role = crate::engines::client_role(&url);
        owner
            .batch_execute(&format!(
                "CREATE TABLE secret (code text NOT NULL); \
             REVOKE ALL ON secret FROM PUBLIC, {role}; \
             CREATE TABLE open (id int NOT NULL); GRANT SELECT ON open TO {role}"
            ))
            .await
            .unwrap();
        for sql in [
            "SELECT code FROM secret",
            "SELECT o.id FROM open o WHERE EXISTS (SELECT 1 FROM secret WHERE code = ?)",
            "WITH s AS (SELECT * FROM secret) SELECT 1 FROM s WHERE false",
            "DELETE FROM secret WHERE code = ?",
            "INSERT INTO open SELECT length(code) FROM secret",
            "EXPLAIN SELECT code FROM secret",
            "CREATE TABLE leak AS SELECT code FROM secret",
            "CREATE MATERIALIZED VIEW leak AS SELECT code FROM secret",
        ] {
            let ran = sql_reply(&router, &sql.replace('?', "'x'")).await;
            assert_eq!(
                refusal(&ran),
                (403, "STATEMENT_NOT_ALLOWED".to_owned()),
                "{sql}"
            );
            let asked = describe(&router, &[], sql).await;
            assert_eq!(refusal(&asked), refusal(&ran), "{sql}");
            assert!(
                !String::from_utf8_lossy(&asked.body).contains("\"columns\""),
                "{sql}"
            );
        }
        // What would run its statement, or whose privileges PostgreSQL checks only when it runs,
        // is not described at all.
        for sql in [
            "EXPLAIN ANALYZE SELECT id FROM open",
            "CALL no_such_procedure()",
        ] {
            let asked = describe(&router, &[], sql).await;
            assert_eq!(
                refusal(&asked),
                (403, "STATEMENT_NOT_ALLOWED".to_owned()),
                "{sql}"
            );
        }
        // A CREATE with AS that EXPLAIN does not take is described as before.
        described(
            &router,
            "CREATE TABLE generated (a int, b int GENERATED ALWAYS AS (a * 2) STORED)",
        )
        .await;
        let open = described(&router, "SELECT id FROM open").await;
        assert_eq!(
            open["columns"],
            json!([{"name": "id", "type": "int4", "nullable": false}])
        );
    }
}
