//! Each request starts from a clean session on PostgreSQL, though the pool reuses connections:
//! what a client's function changes in its session (settings, a temporary table shadowing a real
//! one, the role), prepared statements it leaves behind and the seed it sets never reach the next
//! request, and user-defined types keep working on a reused connection.
//!
//! Each test runs on a pool of one connection, so the next request gets the same session.

use serde_json::json;
use sqlhttp_server::{AppState, app};

use crate::common::{ok, post_with, sql};
use crate::engines::{config, database, needs_postgres, owner, postgres_app};

/// A server on `url` whose pool holds one connection, so every request reuses it.
fn one_connection_app(url: &str) -> axum::Router {
    let mut config = config(url);
    config.limits.pool_size = 1;
    app(AppState::new(&config).unwrap())
}

needs_postgres! {
    /// A client's function may change its session (a setting, a temporary table shadowing a real
    /// one); the next request on that connection starts from a clean session.
    #[tokio::test]
    async fn a_session_changed_by_one_request_is_reset_for_the_next() {
        // One pooled connection, so the next request gets the same session.
        let router = postgres_app!(
            "a_session_changed_by_one_request_is_reset_for_the_next",
            |config| config.limits.pool_size = 1
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
}

needs_postgres! {
    /// Prepared statements a client's function leaves behind (even under the driver's own statement
    /// names) are gone before the next request.
    #[tokio::test]
    async fn prepared_statements_a_client_leaves_behind_are_deallocated() {
        let router = postgres_app!(
            "prepared_statements_a_client_leaves_behind_are_deallocated",
            |config| config.limits.pool_size = 1
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
}

needs_postgres! {
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
}

needs_postgres! {
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
}

needs_postgres! {
    /// A read ends with ROLLBACK and only what outlives a rollback is reset after it (ADR 0037):
    /// everything a read-only request's function can change in its session (settings, the search
    /// path, the read-only default, the role, a listen, the seed, a session advisory lock, a
    /// statement prepared from SQL text) is gone for the next request, read or write.
    #[tokio::test]
    async fn what_a_read_changes_in_its_session_does_not_reach_the_next_request() {
        let Some(url) = database("what_a_read_changes_in_its_session_does_not_reach_the_next").await
        else {
            return;
        };
        let owner = owner(&url).await;
        owner.batch_execute("SELECT setseed(0.5)").await.unwrap();
        let seeded: f64 = owner
            .query_one("SELECT random()", &[])
            .await
            .unwrap()
            .get(0);
        let router = one_connection_app(&url);
        ok(&router, "CREATE TABLE items (name text)", json!([])).await;
        ok(&router, "INSERT INTO items VALUES ('real')", json!([])).await;
        ok(
            &router,
            "CREATE FUNCTION mess() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'SELECT set_' || 'config(''search_path'', ''pg_catalog'', false)'; \
         EXECUTE 'SELECT set_' || 'config(''default_transaction_read_only'', ''off'', false)'; \
         EXECUTE 'SELECT set_' || 'config(''statement_timeout'', ''0'', false)'; \
         EXECUTE 'SELECT set_' || 'config(''application_name'', ''planted'', false)'; \
         EXECUTE 'SET ROLE ' || quote_ident(current_user); \
         EXECUTE 'LISTEN planted'; \
         EXECUTE 'PREPARE planted AS SELECT 1'; \
         PERFORM setseed(0.5); \
         PERFORM pg_advisory_lock(4242); \
         RETURN 1; END $$",
            json!([]),
        )
        .await;
        let read = |sql: &'static str| {
            let router = router.clone();
            async move {
                let reply = post_with(
                    &router,
                    &[],
                    &json!({"sql": sql, "params": [], "read_only": true}),
                )
                .await;
                assert_eq!(reply.status, 200, "{sql}: {}", reply.json());
                reply.json()
            }
        };
        // Unqualified `items` fails under the planted search path.
        let probe = "SELECT (SELECT name FROM items), current_setting('search_path'), \
                 current_setting('application_name'), \
                 current_setting('default_transaction_read_only'), \
                 current_setting('statement_timeout'), current_setting('role'), \
                 (SELECT count(*) FROM pg_listening_channels()), \
                 (SELECT count(*) FROM pg_prepared_statements WHERE from_sql), \
                 (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                  AND pid = pg_backend_pid()), random()";
        let clean = read(probe).await["rows"][0].clone();
        assert_eq!(clean[0], "real");
        let messed = read("SELECT mess()").await;
        assert_eq!(messed["rows"], json!([[1]]));
        for next in [true, false] {
            let seen = if next {
                read(probe).await
            } else {
                ok(&router, probe, json!([])).await
            };
            let row = &seen["rows"][0];
            assert_eq!(
                row.as_array().unwrap()[..9],
                clean.as_array().unwrap()[..9],
                "read next: {next}"
            );
            let random = row[9].as_f64().unwrap();
            assert!(
                (random - seeded).abs() > 1e-9,
                "the next request's random() was predictable: {random}"
            );
            // Mess again for the second probe.
            read("SELECT mess()").await;
        }
    }
}

needs_postgres! {
    /// A client's function can deallocate the statements the driver prepared on its session
    /// (`DEALLOCATE ALL` through dynamic SQL, which the text checks cannot see), after which the
    /// driver cannot look a new type up there. The request that meets it runs again on another
    /// connection, and the broken session is closed: no later request fails for it.
    #[tokio::test]
    async fn a_session_whose_driver_statements_a_function_deallocated_is_replaced() {
        let router = postgres_app!(
            "a_session_whose_driver_statements_a_function_deallocated_is_replaced",
            |config| config.limits.pool_size = 1
        );
        ok(
            &router,
            "CREATE TYPE first_mood AS ENUM ('sad', 'happy')",
            json!([]),
        )
        .await;
        // The driver looks a new type up with statements it prepares once per connection.
        ok(&router, "SELECT 'happy'::first_mood AS m", json!([])).await;
        ok(
            &router,
            "CREATE FUNCTION forget() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
         EXECUTE 'DEALLOCATE ALL'; RETURN 1; END $$",
            json!([]),
        )
        .await;
        for read_only in [true, false] {
            let forgot = post_with(
                &router,
                &[],
                &json!({ "sql": "SELECT forget()", "params": [], "read_only": read_only }),
            )
            .await;
            assert_eq!(forgot.status, 200, "{}", forgot.json());
            let name = format!("mood_{read_only}");
            ok(
                &router,
                &format!("CREATE TYPE {name} AS ENUM ('calm')"),
                json!([]),
            )
            .await;
            let next = ok(&router, &format!("SELECT 'calm'::{name} AS m"), json!([])).await;
            assert_eq!(next["rows"], json!([["calm"]]));
            // A statement the server had cached on that session is prepared again too.
            let again = ok(&router, "SELECT 'happy'::first_mood AS m", json!([])).await;
            assert_eq!(again["rows"], json!([["happy"]]));
        }
    }
}
