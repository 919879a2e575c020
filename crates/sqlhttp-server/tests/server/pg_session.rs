//! The server owns the client role on PostgreSQL, and the reset resets (issue 27, ADR 0029):
//! defaults a client's function plants on the client role, or an operator's `temp_file_limit`,
//! do not take the server down once the pool's sessions end; a password a client's function
//! sets is replaced by the server's (under SCRAM, as in production); user-defined types keep
//! working on a reused connection; `setseed()` does not reach the next request; a sort past
//! `temp_file_limit` answers a clear 400.
//!
//! Each test has a database of its own on the cluster of `engines.rs` (the password test a
//! SCRAM cluster of its own), and talks to the server through its HTTP API only; the owner's
//! side (ending the pool's sessions, reading the role's defaults) is a connection as the
//! cluster's superuser, as an operator's would be.

use std::process::Command;
use std::time::Duration;

use serde_json::json;
use sqlhttp_server::{AppState, app};
use tokio_postgres::{Client, NoTls};

use crate::common::{ok, sql};
use crate::engines::{client_role, config, database, database_on, password_cluster};

/// A connection to the test database as the cluster's superuser (the server's owner).
async fn owner(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A server on `url` whose pool holds one connection, so every request reuses it.
fn one_connection_app(url: &str) -> axum::Router {
    let mut config = config(url);
    config.limits.read_connections = 0;
    app(AppState::new(&config).unwrap())
}

/// Ends every session of `role` from the owner's side, and waits until they are gone.
async fn end_sessions(owner: &Client, role: &str) {
    owner
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&role],
        )
        .await
        .unwrap();
    for _ in 0..200 {
        let left: i64 = owner
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
                &[&role],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            // Let the pool's drivers read the end of their sessions.
            tokio::time::sleep(Duration::from_millis(50)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the sessions of {role} did not end");
}

/// Six requests after the pool's sessions ended: the first may meet a connection whose end the
/// pool has not seen yet (`503`, as for any lost connection); every later one answers.
async fn answered_after_the_sessions_ended(router: &axum::Router) {
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(sql(router, "SELECT 1 AS one", json!([])).await.status);
    }
    assert!(
        statuses[1..].iter().all(|&status| status == 200),
        "statuses after the sessions ended: {statuses:?}"
    );
}

/// The client role's defaults for this database or every one, as `name=value`.
async fn role_defaults(owner: &Client, role: &str) -> Vec<String> {
    owner
        .query(
            "SELECT c FROM pg_db_role_setting AS s, unnest(s.setconfig) AS c \
             WHERE s.setrole = (SELECT oid FROM pg_roles WHERE rolname = $1) ORDER BY 1",
            &[&role],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn a_default_a_client_plants_is_removed_and_requests_go_on() {
    let Some(url) = database("a_default_a_client_plants_is_removed_and_requests_go_on").await
    else {
        return;
    };
    let role = client_role(&url);
    let owner = owner(&url).await;
    // pg_trgm (PostgreSQL's contrib) has a setting any role may set once its library is loaded.
    owner
        .batch_execute("CREATE EXTENSION pg_trgm")
        .await
        .unwrap();
    let router = one_connection_app(&url);
    ok(
        &router,
        "CREATE FUNCTION plant() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         PERFORM similarity('a', 'b'); \
         EXECUTE 'ALTER ROLE ' || quote_ident(current_user) || \
         ' SET pg_trgm.similarity_threshold = 0.9'; END $$",
        json!([]),
    )
    .await;
    ok(&router, "SELECT plant()", json!([])).await;
    assert!(
        role_defaults(&owner, &role)
            .await
            .contains(&"pg_trgm.similarity_threshold=0.9".to_owned()),
        "the client's function planted the default"
    );

    end_sessions(&owner, &role).await;
    answered_after_the_sessions_ended(&router).await;
    assert!(
        !role_defaults(&owner, &role)
            .await
            .iter()
            .any(|entry| entry.starts_with("pg_trgm.")),
        "the planted default is gone"
    );
    let threshold = ok(
        &router,
        "SELECT similarity('a', 'b') >= 0, current_setting('pg_trgm.similarity_threshold')",
        json!([]),
    )
    .await;
    assert_eq!(threshold["rows"], json!([[true, "0.3"]]));
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_runs_with_a_default_planted_while_connections_open() {
    let Some(url) = database("no_request_runs_with_a_default_planted_while_connections_open").await
    else {
        return;
    };
    let role = client_role(&url);
    let owner = owner(&url).await;
    // A pool of several: connections that log in while the default is planted are checked
    // after another connection's check has removed it from the role.
    let mut config = config(&url);
    config.limits.read_connections = 15;
    let router = app(AppState::new(&config).unwrap());
    ok(
        &router,
        "CREATE FUNCTION plant() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'ALTER ROLE ' || quote_ident(current_user) || ' SET work_mem = ''77kB'''; \
         END $$",
        json!([]),
    )
    .await;
    ok(&router, "SELECT plant()", json!([])).await;
    end_sessions(&owner, &role).await;
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..48 {
        let router = router.clone();
        requests.spawn(async move {
            let answer = ok(
                &router,
                "SELECT pg_sleep(0.2)::text, current_setting('work_mem')",
                json!([]),
            )
            .await;
            answer["rows"][0][1].as_str().unwrap_or_default().to_owned()
        });
    }
    let seen = requests.join_all().await;
    assert!(
        seen.iter().all(|work_mem| work_mem != "77kB"),
        "a request ran with the planted default: {seen:?}"
    );
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn an_operators_temp_file_limit_is_kept_and_a_sort_past_it_answers_400() {
    let Some(url) =
        database("an_operators_temp_file_limit_is_kept_and_a_sort_past_it_answers_400").await
    else {
        return;
    };
    let role = client_role(&url);
    let owner = owner(&url).await;
    let router = one_connection_app(&url);
    ok(&router, "SELECT 1", json!([])).await;
    // The operator limits temporary files while the server runs.
    owner
        .batch_execute(&format!("ALTER ROLE {role} SET temp_file_limit = '1MB'"))
        .await
        .unwrap();
    end_sessions(&owner, &role).await;
    answered_after_the_sessions_ended(&router).await;
    assert!(
        role_defaults(&owner, &role)
            .await
            .contains(&"temp_file_limit=1MB".to_owned()),
        "the operator's setting is kept"
    );
    let limit = ok(
        &router,
        "SELECT current_setting('temp_file_limit')",
        json!([]),
    )
    .await;
    assert_eq!(limit["rows"], json!([["1MB"]]));

    // A sort that spills past work_mem (4 MB) writes more than 1 MB of temporary files.
    let sorted = sql(
        &router,
        "SELECT count(DISTINCT md5(g::text)) FROM generate_series(1, 400000) AS g",
        json!([]),
    )
    .await;
    assert_eq!(
        sorted.status,
        400,
        "{}",
        String::from_utf8_lossy(&sorted.body)
    );
    let body = sorted.json();
    assert_eq!(body["error"]["code"], "SQL_ERROR");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("temp_file_limit"), "{message}");
    // And the connection serves the next request.
    ok(&router, "SELECT 1", json!([])).await;
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn temporary_files_are_limited_by_default() {
    let Some(url) = database("temporary_files_are_limited_by_default").await else {
        return;
    };
    let router = one_connection_app(&url);
    let limit = ok(
        &router,
        "SELECT current_setting('temp_file_limit')",
        json!([]),
    )
    .await;
    assert_eq!(limit["rows"], json!([["1GB"]]));
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn a_password_a_client_sets_is_replaced_by_the_servers() {
    let Some(cluster) = password_cluster() else {
        return;
    };
    let url = database_on(&cluster).await;
    let role = client_role(&url);
    let owner = owner(&url).await;
    let router = one_connection_app(&url);
    ok(
        &router,
        "CREATE FUNCTION take_over() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'ALTER ROLE ' || quote_ident(current_user) || ' PASSWORD ''chosen-by-client'''; \
         END $$",
        json!([]),
    )
    .await;
    ok(&router, "SELECT take_over()", json!([])).await;
    let (base, database_name) = url.rsplit_once('/').unwrap();
    let as_client = format!(
        "{}/{database_name}",
        base.replacen("postgres@", &format!("{role}:chosen-by-client@"), 1)
    );
    assert!(
        tokio_postgres::connect(&as_client, NoTls).await.is_ok(),
        "the client's password logs in before the server notices"
    );

    end_sessions(&owner, &role).await;
    answered_after_the_sessions_ended(&router).await;
    assert!(
        tokio_postgres::connect(&as_client, NoTls).await.is_err(),
        "the client's password no longer logs in"
    );
    let who = ok(&router, "SELECT session_user::text", json!([])).await;
    assert_eq!(who["rows"], json!([[role]]));

    drop(router);
    let stop = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/stop-postgres");
    let _ = Command::new(stop).arg(&cluster).status();
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn user_defined_types_keep_working_on_a_reused_connection() {
    let Some(url) = database("user_defined_types_keep_working_on_a_reused_connection").await else {
        return;
    };
    let router = one_connection_app(&url);
    for ddl in [
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
        "CREATE TYPE color AS ENUM ('red', 'green')",
        "CREATE DOMAIN positive AS integer CHECK (VALUE > 0)",
        "CREATE DOMAIN label AS text",
    ] {
        ok(&router, ddl, json!([])).await;
    }
    // Each request meets a type the connection has not looked up yet, and then again: the
    // driver looks types up with statements it prepared on an earlier request.
    let queries = [
        ("SELECT 'happy'::mood AS m", json!([["happy"]])),
        (
            "SELECT ARRAY['red', 'green']::color[] AS c",
            json!([[["red", "green"]]]),
        ),
        ("SELECT 3::positive AS p", json!([[3]])),
        ("SELECT 'x'::label AS l", json!([["x"]])),
    ];
    for round in 0..2 {
        for (query, rows) in &queries {
            let reply = sql(&router, query, json!([])).await;
            assert_eq!(
                reply.status,
                200,
                "round {round}, {query}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(&reply.json()["rows"], rows, "{query}");
        }
    }
    let bound = ok(&router, "SELECT ?::mood::text AS m", json!(["sad"])).await;
    assert_eq!(bound["rows"], json!([["sad"]]));
}

#[cfg_attr(
    sqlhttpd_no_postgres,
    ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
)]
#[tokio::test]
async fn a_seed_a_request_sets_does_not_reach_the_next() {
    let Some(url) = database("a_seed_a_request_sets_does_not_reach_the_next").await else {
        return;
    };
    // What random() answers after setseed(0.5), on a session of its own.
    let owner = owner(&url).await;
    owner.batch_execute("SELECT setseed(0.5)").await.unwrap();
    let seeded: f64 = owner
        .query_one("SELECT random()", &[])
        .await
        .unwrap()
        .get(0);

    let router = one_connection_app(&url);
    ok(&router, "SELECT setseed(0.5)", json!([])).await;
    let next = ok(&router, "SELECT random() AS r", json!([])).await;
    let next = next["rows"][0][0].as_f64().unwrap();
    // The answer's digits may be fewer than the f64's: compare far above that.
    assert!(
        (next - seeded).abs() > 1e-9,
        "the next request's random() was predictable: {next}"
    );
}
