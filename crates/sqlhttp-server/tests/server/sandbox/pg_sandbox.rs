//! The sandbox on PostgreSQL: what a client may not reach (roles, server files and programs, the
//! server's schema `_sqlhttp`), also from inside a function of its own; a set-up that never runs
//! a client's function; transaction control hidden where only PostgreSQL sees it; and what a
//! read-only transaction there would still let a reader do; temporary objects and search paths
//! that never reach another request or the store, and nothing created in `_sqlhttp`.
//! Transaction control both engines refuse is `sql/answers.rs`; the sandbox by effect on SQLite,
//! `sandbox/effects.rs`.

use serde_json::json;
use sqlhttp_server::{AppState, app};

use crate::common::{
    READER, WRITER, batch_with as batch, ok, post_with, sql, with_writer_and_reader,
};
use crate::engines::{app_on, config, database, needs_postgres, postgres_app};
use crate::sandbox::effects::{self as effects, all_refused, keyed, rows};

needs_postgres! {
    #[tokio::test]
    async fn the_sandbox_holds() {
        let router = postgres_app!("the_sandbox_holds");
        for statement in [
            "SET ROLE postgres",
            "RESET ROLE",
            "SELECT set_config('role', 'postgres', true)",
            "START TRANSACTION",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT pg_ls_dir('.')",
            "SELECT lo_import('/etc/passwd')",
            "COPY (SELECT 1) TO '/tmp/sqlhttp-escape'",
            "COPY (SELECT 1) TO PROGRAM 'true'",
            "SELECT * FROM _sqlhttp.idempotency",
            "DELETE FROM _sqlhttp.idempotency",
            "DROP TABLE _sqlhttp.idempotency",
            "SELECT * FROM _sqlhttp.secrets",
            "SELECT * FROM _sqlhttp.lookup('guess', 'k-1')",
            "SELECT _sqlhttp.record('guess', 'k', '', 200, '', 0)",
            "SELECT _sqlhttp.purge('guess', 9223372036854775807)",
            "SELECT _sqlhttp.authorize('guess')",
            "CREATE TABLE _sqlhttp.planted (x int)",
            "DROP SCHEMA _sqlhttp CASCADE",
            "CREATE ROLE escape SUPERUSER",
            "ALTER ROLE CURRENT_USER SUPERUSER",
        ] {
            refused(&sql(&router, statement, json!([])).await, statement);
        }
        // Logged in as the database's client role, not as the URL's `postgres`.
        let who = ok(
            &router,
            "SELECT current_user = session_user, session_user::text LIKE 'client\\_%'",
            json!([]),
        )
        .await;
        assert_eq!(who["rows"], json!([[true, true]]));
    }
}

needs_postgres! {
    /// A client may create functions, and a function may run `RESET ROLE` or `set_config('role')`,
    /// which return to the session's login role: that login is the client role itself, so nothing
    /// is gained: no server file, no program, no store.
    #[tokio::test]
    async fn a_function_of_the_clients_cannot_leave_the_client_role() {
        let router = postgres_app!("a_function_of_the_clients_cannot_leave_the_client_role");
        let define = |body: &str| {
            format!(
                "CREATE OR REPLACE FUNCTION escape() RETURNS text LANGUAGE plpgsql AS \
             $body$ BEGIN {body}; END $body$"
            )
        };
        ok(
            &router,
            &define("RESET ROLE; RETURN current_user::text || ' ' || session_user::text"),
            json!([]),
        )
        .await;
        let who = ok(
            &router,
            "SELECT escape() = session_user || ' ' || session_user, \
         session_user::text LIKE 'client\\_%'",
            json!([]),
        )
        .await;
        assert_eq!(who["rows"], json!([[true, true]]));
        for body in [
            "RESET ROLE; RETURN pg_read_file('/etc/passwd')",
            "RESET ROLE; RETURN (SELECT count(*)::text FROM _sqlhttp.idempotency)",
            "RESET ROLE; RETURN (SELECT store_key FROM _sqlhttp.secrets)",
            // The text check refuses `set_config` where it can see it; not where it cannot.
            "EXECUTE 'SELECT set_' || 'config(''role'', ''postgres'', true)'; \
         RETURN current_user::text",
            "EXECUTE 'SET SESSION AUTHORIZATION postgres'; RETURN current_user::text",
            "EXECUTE 'COPY (SELECT 1) TO PROGRAM ''true'''; RETURN 'ran'",
        ] {
            ok(&router, &define(body), json!([])).await;
            refused(&sql(&router, "SELECT escape()", json!([])).await, body);
        }
    }
}

/// Asserts `403 STATEMENT_NOT_ALLOWED` for what `what` tried.
fn refused(reply: &crate::common::Reply, what: &str) {
    assert_eq!(
        reply.status,
        403,
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{what}");
}

needs_postgres! {
    /// Functions a client puts in `public` that shadow built-ins the server's set-up calls: the
    /// set-up runs as the `--database` role (a superuser here), so it must never call them.
    #[tokio::test]
    async fn the_set_up_never_runs_a_clients_function() {
        let Some(url) = database("the_set_up_never_runs_a_clients_function").await else {
            return;
        };
        let router = app(AppState::new(&config(&url)).unwrap());
        ok(&router, "CREATE TABLE ran_as (who text)", json!([])).await;
        for shadow in [
            "pg_has_role(u text, r text, p text) RETURNS boolean",
            "has_schema_privilege(u text, s text, p text) RETURNS boolean",
            "unnest(a text[]) RETURNS SETOF text",
            "current_database() RETURNS name",
            "format(f text, a text, b text) RETURNS text",
        ] {
            let (signature, returns) = shadow.split_once(" RETURNS ").unwrap();
            let result = if returns.starts_with("SETOF") {
                "RETURN NEXT 'x'"
            } else if returns == "boolean" {
                "RETURN true"
            } else {
                "RETURN 'x'"
            };
            ok(
                &router,
                &format!(
                    "CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE plpgsql AS $f$ \
                 BEGIN INSERT INTO public.ran_as VALUES (current_user::text); {result}; END $f$"
                ),
                json!([]),
            )
            .await;
        }
        drop(router);
        // A restart prepares the database again.
        let restarted = app(AppState::new(&config(&url)).unwrap());
        let ran = ok(&restarted, "SELECT count(*) FROM ran_as", json!([])).await;
        assert_eq!(
            ran["rows"],
            json!([[0]]),
            "the set-up ran a client's function"
        );
    }
}

needs_postgres! {
    /// PostgreSQL's block comments nest: `/* /* */ x */ COMMIT` is a COMMIT there.
    #[tokio::test]
    async fn transaction_control_hidden_in_nested_comments_is_refused() {
        let router = postgres_app!(
            "transaction_control_hidden_in_nested_comments_is_refused",
            with_writer_and_reader
        );
        let (writer, reader) = (WRITER, READER);
        let created = post_with(&router, &writer, &json!({"sql": "CREATE TABLE t (x int)"})).await;
        assert_eq!(created.status, 200);
        for hidden in [
            "/* /* */ x */ COMMIT",
            "/* /* */ x */ END",
            "/* a /* b */ */ ROLLBACK",
            // PostgreSQL ends a line comment at a carriage return too.
            "-- x\rCOMMIT",
        ] {
            let reply = batch(
                &router,
                &reader,
                &json!({"statements": [{"sql": hidden}, {"sql": "INSERT INTO t VALUES (1)"}]}),
            )
            .await;
            assert_eq!(
                reply.status,
                400,
                "{hidden}: {}",
                String::from_utf8_lossy(&reply.body)
            );
        }
        let count = post_with(&router, &reader, &json!({"sql": "SELECT count(*) FROM t"})).await;
        assert_eq!(count.json()["rows"], json!([[0]]));
        // A procedure may not end the server's transaction either: PostgreSQL refuses, and says so.
        let created = post_with(
            &router,
            &writer,
            &json!({"sql": "CREATE PROCEDURE finish() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$"}),
        )
        .await;
        assert_eq!(created.status, 200);
        let called = post_with(&router, &writer, &json!({"sql": "CALL finish()"})).await;
        assert_eq!(
            called.code(),
            "SQL_ERROR",
            "{}",
            String::from_utf8_lossy(&called.body)
        );
    }
}

needs_postgres! {
    /// A read-only transaction lets large objects, locks and notifications through; a reader may
    /// not use them.
    #[tokio::test]
    async fn readers_cannot_write_large_objects_or_lock_tables() {
        let router = postgres_app!(
            "readers_cannot_write_large_objects_or_lock_tables",
            with_writer_and_reader
        );
        let (writer, reader) = (WRITER, READER);
        let created = post_with(&router, &writer, &json!({"sql": "CREATE TABLE t (x int)"})).await;
        assert_eq!(created.status, 200);
        for statement in [
            "SELECT lo_from_bytea(0, 'x')",
            "SELECT lo_create(0)",
            "LOCK TABLE t IN ACCESS EXCLUSIVE MODE",
            "ANALYZE t",
            "NOTIFY c",
            "SELECT pg_notify('c', 'x')",
            "SELECT query_to_xml('select lo_create(0)', true, false, '')",
        ] {
            let reply = post_with(&router, &reader, &json!({ "sql": statement })).await;
            assert_eq!(reply.code(), "READ_ONLY", "{statement}");
        }
        let objects = post_with(
            &router,
            &writer,
            &json!({"sql": "SELECT count(*) FROM pg_largeobject_metadata"}),
        )
        .await;
        assert_eq!(objects.json()["rows"], json!([[0]]));
    }
}

// The batch, the shadow table and the namespace on PostgreSQL: temporary objects never outlive
// their request (the session is reset before the next), the server's statements are qualified,
// so a temp table or a changed search path inside a keyed batch cannot reach the store, and
// nothing can be created in the server's schema `_sqlhttp`.
needs_postgres! {
    #[tokio::test]
    async fn temp_objects_and_search_paths_never_reach_another_request_or_the_store() {
        // One pooled connection, so every request gets the same session.
        let Some(router) = app_on(
            "temp_objects_and_search_paths_never_reach_another_request_or_the_store",
            |config| config.limits.pool_size = 1,
        )
        .await
        else {
            return;
        };
        ok(&router, "CREATE TABLE orders (id int)", json!([])).await;
        // A function that shadows `orders` and puts the temp schema first, as dynamic SQL
        // (the text checks never see it).
        ok(
            &router,
            "CREATE FUNCTION shadow() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'CREATE TEMP TABLE IF NOT EXISTS orders (id int)'; \
         EXECUTE 'CREATE TABLE IF NOT EXISTS pg_temp.idempotency (key text)'; \
         EXECUTE 'SELECT set_' || 'config(''search_path'', \
         ''pg_temp, public, pg_catalog'', false)'; \
         END $$",
            json!([]),
        )
        .await;
        for shadow in [
            "CREATE TEMP TABLE orders (id int)",
            "CREATE TABLE pg_temp.orders (id int)",
            "CREATE TEMPORARY VIEW orders AS SELECT 1 AS id",
            "SELECT shadow()",
        ] {
            ok(&router, shadow, json!([])).await;
            let insert = ok(&router, "INSERT INTO orders VALUES (1)", json!([])).await;
            assert_eq!(insert["rows_affected"], 1, "{shadow}");
        }
        assert_eq!(
            rows(&router, "SELECT count(*) FROM public.orders").await,
            json!([[4]]),
            "every acknowledged write is in the real table"
        );

        // A keyed batch that shadows and moves the search path still applies once.
        let write = ["SELECT shadow()", "INSERT INTO public.orders VALUES (2)"];
        let first = effects::batch(&router, &[("idempotency-key", "k")], &write).await;
        assert_eq!(
            first.status,
            200,
            "{}",
            String::from_utf8_lossy(&first.body)
        );
        let retry = effects::batch(&router, &[("idempotency-key", "k")], &write).await;
        assert_eq!(retry.status, 200);
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
        let single =
            serde_json::json!({"sql": "INSERT INTO orders VALUES (3)", "params": []}).to_string();
        ok(&router, "SELECT shadow()", json!([])).await;
        assert_eq!(keyed(&router, "s", &single).await.status, 200);
        let again = keyed(&router, "s", &single).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(
            rows(
                &router,
                "SELECT id, count(*) FROM public.orders GROUP BY id ORDER BY id"
            )
            .await,
            json!([[1, 4], [2, 1], [3, 1]])
        );
        // The next request's session has no temporary object and the default search path.
        assert_eq!(
            rows(
                &router,
                "SELECT count(*) FROM pg_catalog.pg_class \
             WHERE relnamespace = pg_catalog.pg_my_temp_schema()"
            )
            .await,
            json!([[0]])
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn nothing_can_be_created_in_or_moved_into_the_servers_schema() {
        let Some(router) = app_on(
            "nothing_can_be_created_in_or_moved_into_the_servers_schema",
            |_| {},
        )
        .await
        else {
            return;
        };
        ok(&router, "CREATE TABLE t (id int)", json!([])).await;
        ok(
            &router,
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            json!([]),
        )
        .await;
        all_refused(
            &router,
            &[
                "CREATE TABLE _sqlhttp.idempotency2 (key text)",
                "CREATE TABLE \"_sqlhttp\".x (a int)",
                "CREATE VIEW _sqlhttp.v AS SELECT 1",
                "CREATE FUNCTION _sqlhttp.lookup(text, text, text) RETURNS int \
             LANGUAGE sql AS 'SELECT 1'",
                "CREATE OR REPLACE FUNCTION _sqlhttp.authorize(p_store_key text) RETURNS void \
             LANGUAGE sql AS 'SELECT'",
                "ALTER TABLE t SET SCHEMA _sqlhttp",
                "ALTER FUNCTION f() SET SCHEMA _sqlhttp",
                "CREATE INDEX i ON _sqlhttp.idempotency (status)",
                "SELECT * FROM _sqlhttp.idempotency",
                "SELECT * FROM _sqlhttp.secrets",
                "SELECT * FROM _sqlhttp.lookup('guess', 'k')",
                "CREATE SCHEMA _sqlhttp2",
            ],
        )
        .await;
        assert_eq!(
            rows(
                &router,
                "SELECT c.relname::text FROM pg_catalog.pg_class AS c \
             JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
             WHERE n.nspname = '_sqlhttp' ORDER BY 1"
            )
            .await,
            json!([
                ["idempotency"],
                ["idempotency_created_at"],
                ["idempotency_pkey"],
                ["secrets"],
                ["secrets_pkey"]
            ])
        );
    }
}
