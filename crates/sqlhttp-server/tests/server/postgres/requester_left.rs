//! A requester that goes away while its statement runs on PostgreSQL (ADR 0070: the request's
//! work runs on the requester's own task until then, and goes on as a task of its own): the
//! statement is cancelled at once, nothing it did is kept, what it held (a row lock, its
//! session) is free for the next request, and no session is left running it.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{ok, post_with, sql};
use crate::engines::{needs_postgres, postgres_app};

/// Two connections: the next request is never kept waiting for the pool, only for the lock.
fn two_connections(config: &mut sqlhttp_server::Config) {
    config.limits.pool_size = 2;
}

/// How many sessions other than the asking one still run `marker`'s statement.
async fn still_running(router: &axum::Router, marker: &str) -> i64 {
    let rows = ok(
        router,
        "SELECT count(*)::int FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
         AND state <> 'idle' AND strpos(query, $1) > 0",
        json!([marker]),
    )
    .await;
    rows["rows"][0][0].as_i64().unwrap()
}

needs_postgres! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_whose_requester_left_is_stopped_at_once_keeps_nothing_and_frees_its_lock() {
        let router = postgres_app!(
            "a_statement_whose_requester_left_is_stopped_at_once_keeps_nothing_and_frees_its_lock",
            two_connections
        );
        ok(&router, "CREATE TABLE kv (k int PRIMARY KEY, v text)", json!([])).await;
        ok(&router, "CREATE TABLE written (marker text)", json!([])).await;
        ok(&router, "INSERT INTO kv VALUES (1, 'before')", json!([])).await;
        // Each writes a row and holds the row lock of `kv`'s row while it sleeps; the marker
        // names it in `pg_stat_activity`.
        let write = |marker: &str| {
            format!(
                "/* {marker} */ WITH w AS (INSERT INTO written VALUES ('{marker}')) \
                 UPDATE kv SET v = '{marker}' WHERE k = 1 RETURNING pg_sleep(30)"
            )
        };
        for (marker, body) in [
            // A write sent as a statement, in flights.
            ("left_write", json!({"sql": write("left_write"), "params": []})),
            // The same as a keyed write, through the driver's path.
            ("left_keyed", json!({"sql": write("left_keyed"), "params": []})),
            // A verified read: it holds a session.
            (
                "left_read",
                json!({"sql": "/* left_read */ SELECT pg_sleep(30)", "params": [], "read_only": true}),
            ),
        ] {
            let headers: &[(&str, &str)] = if marker == "left_keyed" {
                &[("idempotency-key", "requester-left-keyed")]
            } else {
                &[]
            };
            let left =
                tokio::time::timeout(Duration::from_millis(500), post_with(&router, headers, &body))
                    .await;
            assert!(left.is_err(), "{marker} was answered before its requester left");
            let started = Instant::now();
            // The row's lock is free: a plain lock wait (one second) would answer 503.
            let next = sql(&router, "UPDATE kv SET v = 'next' WHERE k = 1", json!([])).await;
            assert_eq!(
                next.status,
                200,
                "{marker}: {}",
                String::from_utf8_lossy(&next.body)
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{marker}: the next write waited {:?}",
                started.elapsed()
            );
            let rows = ok(
                &router,
                "SELECT (SELECT v FROM kv WHERE k = 1), (SELECT count(*)::int FROM written)",
                json!([]),
            )
            .await;
            assert_eq!(rows["rows"], json!([["next", 0]]), "{marker} kept what it did");
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let running = still_running(&router, &format!("/* {marker} */")).await;
                if running == 0 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{marker}: {running} session(s) still run it"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One connection: a second request waits for it behind the first.
fn one_connection(config: &mut sqlhttp_server::Config) {
    config.limits.pool_size = 1;
}

needs_postgres! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_whose_requester_left_while_it_waited_for_a_connection_never_runs() {
        let router = postgres_app!(
            "a_write_whose_requester_left_while_it_waited_for_a_connection_never_runs",
            one_connection
        );
        ok(&router, "CREATE TABLE queued (k int)", json!([])).await;
        for round in 0..4 {
            // The only connection, held for a while.
            let holder = {
                let router = router.clone();
                tokio::spawn(async move { sql(&router, "SELECT pg_sleep(1)", json!([])).await })
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
            let left = tokio::time::timeout(
                Duration::from_millis(300),
                sql(&router, "INSERT INTO queued VALUES ($1)", json!([round])),
            )
            .await;
            assert!(left.is_err(), "round {round}: answered while the connection was held");
            assert_eq!(holder.await.unwrap().status, 200);
            // Whatever the left request was going to do, it has had the time to.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let rows = ok(&router, "SELECT count(*)::int FROM queued", json!([])).await;
            assert_eq!(rows["rows"], json!([[0]]), "round {round}: a write ran for nobody");
        }
    }
}
