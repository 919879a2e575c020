//! The server on PostgreSQL: every endpoint's shape, the SQLSTATE table, the sandbox, exactly
//! once, batches, streaming and the type mapping, each test on a database of its own from
//! [`crate::engines`].

use std::process::Command;
use std::time::Duration;

use serde_json::json;
use sqlhttp_server::{AppState, Config, Limits, app};

use crate::common::{
    READER, WRITER, batch_with as batch, ok, post_with, sql, with_writer_and_reader,
};
use crate::engines::{config, database, database_on, password_cluster, postgres_app, with_role};

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn values_map_to_json_cells() {
    let router = postgres_app!("values_map_to_json_cells");
    let row = ok(
        &router,
        "SELECT true, 7::int2, 12.50::numeric, 'NaN'::float8, \
         '2024-06-01 12:30:00.25+02'::timestamptz, '2024-06-01'::date, '13:14:15'::time, \
         '2024-06-01 01:02:03'::timestamp, '123e4567-e89b-12d3-a456-426614174000'::uuid, \
         '{\"a\": [1, 2]}'::jsonb, '\\x00ff10'::bytea, ARRAY[[1, 2], [3, NULL]]::int4[], \
         '1 day 2 hours'::interval, NULL::text, 123456789012345678901234567890.5::numeric",
        json!([]),
    )
    .await;
    assert_eq!(
        row["rows"][0],
        json!([
            true,
            7,
            "12.50",
            null,
            "2024-06-01T10:30:00.25Z",
            "2024-06-01",
            "13:14:15",
            "2024-06-01T01:02:03",
            "123e4567-e89b-12d3-a456-426614174000",
            {"a": [1, 2]},
            {"base64": "AP8Q"},
            [[1, 2], [3, null]],
            "P1DT2H",
            null,
            "123456789012345678901234567890.5"
        ])
    );
    let unsupported = sql(&router, "SELECT point(1, 2) AS p", json!([])).await;
    assert_eq!(unsupported.status, 400);
    assert!(
        unsupported.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("p::text")
    );
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn parameters_take_the_types_postgresql_infers() {
    let router = postgres_app!("parameters_take_the_types_postgresql_infers");
    ok(
        &router,
        "CREATE TABLE t (n numeric, d date, u uuid, j jsonb, b bytea, f boolean, a int[])",
        json!([]),
    )
    .await;
    ok(
        &router,
        "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?)",
        json!([
            "10.10",
            "2024-02-29",
            "123e4567-e89b-12d3-a456-426614174000",
            "{\"k\": true}",
            {"base64": "AQI="},
            1,
            "{1,2}"
        ]),
    )
    .await;
    let row = ok(
        &router,
        "SELECT n, d, u, j, b, f, a FROM t WHERE n = ? AND j ?? 'k'",
        json!([10.1]),
    )
    .await;
    assert_eq!(
        row["rows"],
        json!([[
            "10.10",
            "2024-02-29",
            "123e4567-e89b-12d3-a456-426614174000",
            {"k": true},
            {"base64": "AQI="},
            true,
            [1, 2]
        ]])
    );
    let wrong = sql(&router, "SELECT ?::int", json!([1, 2])).await;
    assert_eq!(wrong.code(), "SQL_ERROR");
    assert!(
        wrong.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("takes 1")
    );
    let bad = sql(&router, "SELECT ?::int", json!(["x"])).await;
    assert_eq!(bad.code(), "SQL_ERROR");
    let blob = sql(&router, "SELECT ?::int", json!([{"base64": "AA=="}])).await;
    assert_eq!(blob.code(), "SQL_ERROR");
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn errors_follow_the_sqlstate_table() {
    let router = postgres_app!("errors_follow_the_sqlstate_table");
    // Both engines' error table is `answers.rs`; PostgreSQL also fails at run time.
    let reply = sql(&router, "SELECT 1/0", json!([])).await;
    assert_eq!(reply.code(), "SQL_ERROR");
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
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

/// A client may create functions, and a function may run `RESET ROLE` or `set_config('role')`,
/// which return to the session's login role: that login is the client role itself, so nothing
/// is gained: no server file, no program, no store.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
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

/// Functions a client puts in `public` that shadow built-ins the server's set-up calls: the
/// set-up runs as the `--database` role (a superuser here), so it must never call them.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
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

/// PostgreSQL's block comments nest: `/* /* */ x */ COMMIT` is a COMMIT there.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
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

/// A client's function can lower PostgreSQL's statement_timeout for its own transaction; the
/// server's own clock still ends the request and frees the connection.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn the_statement_timeout_holds_when_a_client_lowers_its_guard() {
    let router = postgres_app!(
        "the_statement_timeout_holds_when_a_client_lowers_its_guard",
        |config| config.limits.statement_timeout = Duration::from_millis(300)
    );
    let started = std::time::Instant::now();
    let reply = batch(
        &router,
        &[],
        &json!({"statements": [
            {"sql": "SELECT query_to_xml('select pg_catalog.set_' || 'config(''statement_timeout'', ''0'', true)', true, false, '')::text"},
            {"sql": "SELECT pg_sleep(30)"},
        ]}),
    )
    .await;
    timed_out(&reply, started);
    ok(&router, "SELECT 1", json!([])).await;
}

/// Work PostgreSQL does at COMMIT (a deferred trigger) is bounded too, even after a client's
/// function lowered the statement timeout.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn the_statement_timeout_holds_at_commit() {
    let router = postgres_app!("the_statement_timeout_holds_at_commit", |config| {
        config.limits.statement_timeout = Duration::from_millis(300);
    });
    ok(&router, "CREATE TABLE dt (x int)", json!([])).await;
    ok(
        &router,
        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         PERFORM pg_sleep(30); RETURN NULL; END $$",
        json!([]),
    )
    .await;
    ok(
        &router,
        "CREATE CONSTRAINT TRIGGER late AFTER INSERT ON dt DEFERRABLE INITIALLY DEFERRED \
         FOR EACH ROW EXECUTE FUNCTION slow()",
        json!([]),
    )
    .await;
    let started = std::time::Instant::now();
    let reply = batch(
        &router,
        &[],
        &json!({"statements": [
            {"sql": "SELECT query_to_xml('select pg_catalog.set_' || 'config(''statement_timeout'', ''0'', true)', true, false, '')::text"},
            {"sql": "INSERT INTO dt VALUES (1)"},
        ]}),
    )
    .await;
    timed_out(&reply, started);
    let count = ok(&router, "SELECT count(*) FROM dt", json!([])).await;
    assert_eq!(count["rows"], json!([[0]]));
}

/// A function can catch the cancel PostgreSQL's timeout and the server send, and go on: the
/// server ends that session, so it does not keep its locks and a connection slot.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn a_session_that_ignores_cancels_is_ended() {
    let Some(url) = database("a_session_that_ignores_cancels_is_ended").await else {
        return;
    };
    let mut config = config(&url);
    config.limits.statement_timeout = Duration::from_millis(300);
    let router = app(AppState::new(&config).unwrap());
    ok(
        &router,
        "CREATE FUNCTION stubborn(secs int) RETURNS int LANGUAGE plpgsql AS $$ \
         DECLARE t0 timestamptz := clock_timestamp(); BEGIN \
         WHILE clock_timestamp() < t0 + make_interval(secs => secs) LOOP \
         BEGIN PERFORM pg_sleep(0.1); EXCEPTION WHEN query_canceled THEN NULL; END; \
         END LOOP; RETURN 0; END $$",
        json!([]),
    )
    .await;
    let started = std::time::Instant::now();
    let reply = sql(&router, "SELECT stubborn(30) AS stubborn_call", json!([])).await;
    assert_eq!(reply.code(), "STATEMENT_TIMEOUT");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let (owner, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let mut running = i64::MAX;
    for _ in 0..50 {
        running = owner
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%stubborn_call%' \
                 AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if running == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(running, 0, "the session the server gave up on still runs");
    drop(owner);
    let _ = driver.await;
}

/// Errors stay small, and those a client's own code raises are its own.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn messages_stay_small_and_a_clients_errors_are_its_own() {
    let router = postgres_app!("messages_stay_small_and_a_clients_errors_are_its_own");
    ok(
        &router,
        "CREATE FUNCTION shout(n int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
         RAISE EXCEPTION USING MESSAGE = repeat('A', n); END $$",
        json!([]),
    )
    .await;
    let loud = sql(&router, "SELECT shout(1000000)", json!([])).await;
    assert_eq!(loud.code(), "SQL_ERROR");
    assert!(loud.body.len() < 8192, "{} bytes", loud.body.len());

    // Errors a client's own code raises are its errors, not the server's.
    let unmatched = sql(
        &router,
        "CREATE FUNCTION pick(n int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
         CASE n WHEN 1 THEN RETURN 1; END CASE; END $$",
        json!([]),
    )
    .await;
    assert_eq!(unmatched.status, 200);
    assert_eq!(
        sql(&router, "SELECT pick(2)", json!([])).await.code(),
        "SQL_ERROR"
    );
    // A "char" past ASCII is written as PostgreSQL writes it.
    let byte = ok(&router, "SELECT 'é'::\"char\" AS c", json!([])).await;
    assert_eq!(byte["rows"], json!([["\\303"]]));
}

/// Asserts `422 STATEMENT_TIMEOUT`, well before the 30 s the statements would take.
fn timed_out(reply: &crate::common::Reply, started: std::time::Instant) {
    assert_eq!(
        reply.code(),
        "STATEMENT_TIMEOUT",
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A role may alter itself: a client's function can plant session defaults for every session
/// to come. The connection that logs in with them is refused, they are removed, and the next
/// one is clean.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn defaults_a_client_plants_on_its_role_are_removed() {
    let router = postgres_app!(
        "defaults_a_client_plants_on_its_role_are_removed",
        |config| config.limits.read_connections = 0
    );
    ok(
        &router,
        "CREATE FUNCTION plant() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'ALTER ROLE ' || quote_ident(current_user) || ' SET search_path = evil, public'; \
         EXECUTE 'ALTER ROLE ' || quote_ident(current_user) || ' SET application_name = planted'; \
         EXECUTE 'ALTER ROLE ' || quote_ident(current_user) \
             || ' SET default_transaction_read_only = on'; \
         EXECUTE 'ALTER ROLE ' || quote_ident(current_user) || ' SET statement_timeout = 1'; \
         END $$",
        json!([]),
    )
    .await;
    ok(&router, "SELECT plant()", json!([])).await;
    // End this session: the pool logs in again, with whatever defaults the role has.
    let _ = sql(
        &router,
        "SELECT pg_terminate_backend(pg_backend_pid())",
        json!([]),
    )
    .await;
    let mut seen = None;
    for _ in 0..5 {
        let reply = sql(
            &router,
            "SELECT current_setting('application_name'), current_setting('search_path')",
            json!([]),
        )
        .await;
        if reply.status == 200 {
            seen = Some(reply.json()["rows"].clone());
            break;
        }
    }
    assert_eq!(seen, Some(json!([["", "\"$user\", public"]])));
    // The server's own temp_file_limit stays (ADR 0029).
    let planted = ok(
        &router,
        "SELECT count(*) FROM pg_db_role_setting AS s, unnest(s.setconfig) AS c \
         WHERE s.setrole = (SELECT oid FROM pg_roles WHERE rolname = session_user) \
         AND c NOT LIKE 'temp\\_file\\_limit=%'",
        json!([]),
    )
    .await;
    assert_eq!(planted["rows"], json!([[0]]));
}

/// Prepared statements a client's function leaves behind (even under the driver's own statement
/// names) are gone before the next request.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn prepared_statements_a_client_leaves_behind_are_deallocated() {
    let router = postgres_app!(
        "prepared_statements_a_client_leaves_behind_are_deallocated",
        |config| config.limits.read_connections = 0
    );
    ok(
        &router,
        "CREATE FUNCTION squat() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         FOR i IN 0..2000 LOOP EXECUTE format('PREPARE s%s AS SELECT 1', i); END LOOP; END $$",
        json!([]),
    )
    .await;
    // The squatting request itself may trip on its own statements; the next ones must not.
    let _ = sql(&router, "SELECT squat()", json!([])).await;
    for _ in 0..3 {
        // Prepared by SQL, that is, not this request's own statement.
        let left = ok(
            &router,
            "SELECT count(*) FROM pg_prepared_statements WHERE from_sql",
            json!([]),
        )
        .await;
        assert_eq!(left["rows"], json!([[0]]));
    }
}

/// A read-only transaction lets large objects, locks and notifications through; a reader may
/// not use them.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
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

/// A client's function may change its session (a setting, a temporary table shadowing a real
/// one); the next request on that connection starts from a clean session.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn a_session_changed_by_one_request_is_reset_for_the_next() {
    // One pooled connection, so the next request gets the same session.
    let router = postgres_app!(
        "a_session_changed_by_one_request_is_reset_for_the_next",
        |config| config.limits.read_connections = 0
    );
    ok(&router, "CREATE TABLE items (name text)", json!([])).await;
    ok(&router, "INSERT INTO items VALUES ('real')", json!([])).await;
    ok(
        &router,
        "CREATE FUNCTION plant() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'CREATE TEMPORARY TABLE items (name text)'; \
         EXECUTE 'INSERT INTO items VALUES (''planted'')'; \
         EXECUTE 'SELECT set_' || 'config(''search_path'', ''pg_temp, public'', false)'; \
         EXECUTE 'SELECT set_' || 'config(''application_name'', ''planted'', false)'; \
         EXECUTE 'SET ROLE ' || quote_ident(current_user); END $$",
        json!([]),
    )
    .await;
    ok(&router, "SELECT plant()", json!([])).await;
    let seen = ok(
        &router,
        "SELECT name, current_setting('application_name'), current_setting('role') FROM items",
        json!([]),
    )
    .await;
    assert_eq!(seen["rows"], json!([["real", "", "none"]]));
}

#[tokio::test]
async fn a_bad_url_or_an_unreachable_database_fails_at_start() {
    assert!(
        "postgres://x:1:2/"
            .parse::<sqlhttp_server::Database>()
            .is_err()
    );
    let config = Config {
        database: "postgres://nobody@127.0.0.1:1/none".parse().unwrap(),
        limits: Limits::default(),
        ..Config::default()
    };
    let err = AppState::new(&config).unwrap_err().to_string();
    assert!(err.contains("cannot connect"), "{err}");
}

/// Runs `sql` as the cluster's owner on `url`'s database.
async fn as_owner(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    client.batch_execute(sql).await.unwrap();
    drop(client);
    let _ = driver.await;
}

/// The login path as production runs it: on a cluster that asks every role but `postgres` for
/// its SCRAM password, the server logs in as the client role it created, with the password
/// kept in the database, again after a restart; a second database cannot share that role, and
/// says so at start.
#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn passwords_are_checked_as_in_production() {
    let Some(cluster) = password_cluster() else {
        return;
    };
    let default_role = |url: &str| Config {
        database: url.parse().unwrap(),
        ..Config::default()
    };
    let first = database_on(&cluster).await;
    let router = app(AppState::new(&default_role(&first)).unwrap());
    let who = ok(&router, "SELECT session_user::text", json!([])).await;
    assert_eq!(who["rows"], json!([["sqlhttp_client"]]));

    // The role's password is checked: without it, no login.
    let (base, _) = first.rsplit_once('/').unwrap();
    let as_client = base.replacen("postgres@", "sqlhttp_client@", 1) + "/postgres";
    let refused = tokio_postgres::connect(&as_client, tokio_postgres::NoTls).await;
    assert!(
        refused.is_err(),
        "the cluster asks the client role for a password"
    );

    // A restart logs in again with the password kept in the database.
    drop(router);
    let restarted = app(AppState::new(&default_role(&first)).unwrap());
    ok(&restarted, "SELECT 1", json!([])).await;

    // Another database's server cannot log in as that role, and says what to do.
    let second = database_on(&cluster).await;
    let err = AppState::new(&default_role(&second))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("give this server another --client-role"),
        "{err}"
    );
    let own = app(AppState::new(&with_role(&second, "second_client")).unwrap());
    let who = ok(&own, "SELECT session_user::text", json!([])).await;
    assert_eq!(who["rows"], json!([["second_client"]]));

    let stop = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/stop-postgres");
    drop((restarted, own));
    let _ = Command::new(stop).arg(&cluster).status();
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn client_roles_are_created_checked_and_logged_in_as() {
    let Some(url) = database("client_roles_are_created_checked_and_logged_in_as").await else {
        return;
    };
    let pid = std::process::id();

    // A role of the operator's choosing is created, and client statements log in as it.
    let custom = format!("app_client_{pid}");
    let router = app(AppState::new(&with_role(&url, &custom)).unwrap());
    let who = ok(&router, "SELECT session_user::text", json!([])).await;
    assert_eq!(who["rows"], json!([[custom]]));

    // A client role with rights a client must not have is refused at start.
    for (right, grant) in [
        ("createdb", "ALTER ROLE {role} CREATEDB"),
        ("createrole", "ALTER ROLE {role} CREATEROLE"),
        ("files", "GRANT pg_read_server_files TO {role}"),
    ] {
        let role = format!("risky_{right}_{pid}");
        as_owner(
            &url,
            &format!(
                "CREATE ROLE {role} LOGIN; {}",
                grant.replace("{role}", &role)
            ),
        )
        .await;
        let err = AppState::new(&with_role(&url, &role))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rights a client must not have"),
            "{right}: {err}"
        );
    }

    // One that may not log in is refused, with what to do.
    let nologin = format!("nologin_{pid}");
    as_owner(&url, &format!("CREATE ROLE {nologin} NOLOGIN")).await;
    let err = AppState::new(&with_role(&url, &nologin))
        .unwrap_err()
        .to_string();
    assert!(err.contains("may not log in"), "{err}");

    // The URL's own role is never the client role.
    let err = AppState::new(&with_role(&url, "postgres"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("logs in as the client role"), "{err}");
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn a_requester_that_goes_away_cancels_its_statement() {
    let Some(url) = database("a_requester_that_goes_away_cancels_its_statement").await else {
        return;
    };
    let router = app(AppState::new(&config(&url)).unwrap());
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        sql(&router, "SELECT pg_sleep(30) AS abandoned_sleep", json!([])),
    )
    .await;
    assert!(abandoned.is_err(), "the sleep was still running");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let mut running = i64::MAX;
    for _ in 0..100 {
        running = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                 AND query LIKE '%abandoned_sleep%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if running == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running, 0, "the abandoned statement was cancelled");
    drop(client);
    let _ = driver.await;
    ok(&router, "SELECT 1", json!([])).await;
}
