//! The server owns the client role on PostgreSQL (issue 27, ADR 0029): defaults a client's
//! function plants on the client role are removed (the next session is clean), and neither they
//! nor an operator's `temp_file_limit` take the server down once the pool's sessions end; a
//! password a client's function sets is replaced by the server's (under SCRAM, as in
//! production); a sort past `temp_file_limit` answers a clear 400. What a request changes in its
//! own session is `postgres/reset.rs`; how the server logs in, `postgres/login.rs`.
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
use crate::engines::{
    client_role, config, database, database_on, needs_postgres, owner, password_cluster,
    postgres_app,
};

/// A server on `url` whose pool holds one connection, so every request reuses it.
fn one_connection_app(url: &str) -> axum::Router {
    let mut config = config(url);
    config.limits.pool_size = 1;
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

needs_postgres! {
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
}

needs_postgres! {
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
        config.limits.pool_size = 16;
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
}

needs_postgres! {
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
}

needs_postgres! {
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
}

needs_postgres! {
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
}

needs_postgres! {
    /// A role may alter itself: a client's function can plant session defaults for every session
    /// to come. The connection that logs in with them is refused, they are removed, and the next
    /// one is clean.
    #[tokio::test]
    async fn defaults_a_client_plants_on_its_role_are_removed() {
        let router = postgres_app!(
            "defaults_a_client_plants_on_its_role_are_removed",
            |config| config.limits.pool_size = 1
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
}

needs_postgres! {
    /// A verified read's flight takes the session's socket from the driver and gives it back
    /// (ADR 0061): the driver must still be the one woken when the session ends afterwards, so
    /// the pool sees the end and the next read meets a fresh session, not the dead one. The
    /// driver is no longer woken after every flight to wait again (ADR 0065); this is what that
    /// must not lose.
    #[tokio::test]
    async fn a_session_that_ends_between_verified_reads_is_replaced_before_the_next() {
        let Some(url) =
            database("a_session_that_ends_between_verified_reads_is_replaced_before_the_next")
                .await
        else {
            return;
        };
        let role = client_role(&url);
        let owner = owner(&url).await;
        let router = one_connection_app(&url);
        let verified = json!({"sql": "SELECT 1 AS one", "params": [], "read_only": true});
        for round in 0..3 {
            for _ in 0..3 {
                let reply = crate::common::post_with(&router, &[], &verified).await;
                let body = String::from_utf8_lossy(&reply.body);
                assert_eq!(reply.status, 200, "round {round}: {body}");
            }
            end_sessions(&owner, &role).await;
            // Time for a busy machine to run the driver's task. A driver nobody registered on
            // the socket would never read the end, however long this is.
            tokio::time::sleep(Duration::from_millis(300)).await;
            // The driver read the session's end while idle: the first read after it is served.
            let reply = crate::common::post_with(&router, &[], &verified).await;
            let body = String::from_utf8_lossy(&reply.body);
            assert_eq!(reply.status, 200, "round {round}, after the end: {body}");
        }
    }
}
