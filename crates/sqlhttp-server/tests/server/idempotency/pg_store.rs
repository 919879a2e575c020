//! Exactly once on PostgreSQL, where it differs from SQLite: the store is a table of the
//! server's schema `_sqlhttp` (a server purges expired outcomes from it), and a deferred
//! constraint fails before the outcome is stored. What holds on both engines is
//! `idempotency/keys.rs`.

use std::time::Duration;

use serde_json::json;
use sqlhttp_server::{AppState, app};

use crate::common::{ok, post_with};
use crate::engines::{config, database, needs_postgres, postgres_app};

needs_postgres! {
    #[tokio::test]
    async fn an_expired_key_runs_again_and_is_purged() {
        let Some(url) = database("an_expired_key_runs_again_and_is_purged").await else {
            return;
        };
        let ttl = Duration::from_millis(300);
        let with_ttl = || {
            let mut config = config(&url);
            config.idempotency_ttl = Some(ttl);
            app(AppState::new(&config).unwrap())
        };
        let router = with_ttl();
        ok(&router, "CREATE TABLE t (x int)", json!([])).await;
        let body = json!({"sql": "INSERT INTO t VALUES (1)"});
        let key = [("idempotency-key", "short-lived")];
        assert_eq!(post_with(&router, &key, &body).await.status, 200);
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        let again = post_with(&router, &key, &body).await;
        assert_eq!(again.status, 200);
        assert_eq!(
            again.header("idempotent-replayed"),
            None,
            "expired: run again"
        );
        let count = ok(&router, "SELECT count(*) FROM t", json!([])).await;
        assert_eq!(count["rows"], json!([[2]]));

        // A server purges expired outcomes on its first keyed request (then once a minute).
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        let fresh_server = with_ttl();
        let other = [("idempotency-key", "another")];
        assert_eq!(post_with(&fresh_server, &other, &body).await.status, 200);
        let (owner, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let keys: Vec<String> = owner
            .query(
                "SELECT key FROM _sqlhttp.idempotency WHERE key <> 'sqlhttp peer secret' ORDER BY key",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(keys, ["another"]);
        drop(owner);
        let _ = driver.await;
    }
}

needs_postgres! {
    /// A deferred constraint fails at the end of the work, not in a COMMIT after the outcome was
    /// stored: a keyed request's 409 is replayed like any other final answer.
    #[tokio::test]
    async fn a_deferred_failure_is_a_stored_outcome() {
        let router = postgres_app!("a_deferred_failure_is_a_stored_outcome");
        ok(
            &router,
            "CREATE TABLE d (x int, CONSTRAINT u UNIQUE (x) DEFERRABLE INITIALLY DEFERRED)",
            json!([]),
        )
        .await;
        ok(&router, "INSERT INTO d VALUES (1)", json!([])).await;
        let key = [("idempotency-key", "deferred-1")];
        let body = json!({"sql": "INSERT INTO d VALUES (1)"});
        let first = post_with(&router, &key, &body).await;
        assert_eq!(first.code(), "CONSTRAINT_VIOLATION");
        let again = post_with(&router, &key, &body).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.body, first.body);
    }
}
