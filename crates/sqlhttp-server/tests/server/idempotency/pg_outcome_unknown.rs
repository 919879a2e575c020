//! A write whose COMMIT does not answer in time on PostgreSQL (a synchronous standby that
//! stalls: the commit is durable on the primary, waiting for a standby that never confirms) is
//! answered `503 OUTCOME_UNKNOWN`, never `UNAVAILABLE` ("busy, nothing ran"): a plain write, a
//! keyed one (whose re-send replays it once the database answers again, never running it
//! twice) and an interactive transaction's COMMIT (whose re-send is answered from its commit
//! record). On a cluster of its own: the stall is the whole cluster's setting.

use std::time::Duration;

use axum::Router;
use serde_json::{Value, json};
use sqlhttp_server::{AppState, app};

use crate::common::{Reply, ok, send};
use crate::engines::{config, database_on, needs_postgres, start_cluster};

/// `synchronous_standby_names` for the whole cluster at `cluster`, reloaded and in force for
/// the database at `url` when this returns (`None` resets it).
async fn standbys(cluster: &str, url: &str, names: Option<&str>) {
    let (client, connection) = tokio_postgres::connect(cluster, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let set = match names {
        Some(names) => format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'"),
        None => "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
    };
    client.batch_execute(&set).await.unwrap();
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
    // A reload reaches the processes asynchronously (the checkpointer tells the backends
    // whether standbys are waited for): wait until a commit of its own stalls, or does not.
    let stalls = names.is_some();
    for _ in 0..100 {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let probe = client.batch_execute(
            "CREATE TABLE IF NOT EXISTS probe (x int); INSERT INTO probe VALUES (1)",
        );
        let stalled = tokio::time::timeout(Duration::from_millis(300), probe)
            .await
            .is_err();
        drop(client);
        driver.abort();
        if stalled == stalls {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("synchronous_standby_names = {names:?} did not take effect");
}

async fn post(router: &Router, path: &str, key: Option<&str>, body: &Value) -> Reply {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    send(router, "POST", path, &headers, body.to_string()).await
}

fn unknown(reply: &Reply, what: &str) {
    assert_eq!(
        (reply.status, reply.code().as_str()),
        (503, "OUTCOME_UNKNOWN"),
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
}

needs_postgres! {
    #[tokio::test]
    async fn a_commit_that_does_not_answer_is_an_unknown_outcome_not_unavailable() {
        let Some(cluster) = start_cluster("trust") else {
            assert!(
                std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
                "cannot start a cluster of its own, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
            );
            return;
        };
        let url = database_on(&cluster).await;
        // The test clusters commit asynchronously; this database waits for its standbys as a
        // production one does (a database's setting wins over the server's command line).
        let (_, name) = url.rsplit_once('/').unwrap();
        let (admin, connection) = tokio_postgres::connect(&cluster, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {name} SET synchronous_commit = on"
            ))
            .await
            .unwrap();
        drop(admin);
        let _ = driver.await;
        let mut config = config(&url);
        config.limits.statement_timeout = Duration::from_millis(500);
        let router = app(AppState::new(&config).unwrap());
        ok(&router, "CREATE TABLE t (x INTEGER)", json!([])).await;
        let tx = post(&router, "/api/v1/transaction/open", None, &json!({})).await;
        let tx = tx.json()["transaction"].as_str().unwrap().to_owned();
        let step = post(
            &router,
            "/api/v1/transaction/statement",
            None,
            &json!({"transaction": tx, "seq": 1, "sql": "INSERT INTO t VALUES (3)"}),
        )
        .await;
        assert_eq!(step.status, 200);

        // From here every COMMIT waits for a standby that does not exist.
        standbys(&cluster, &url, Some("nobody")).await;
        let insert = |x: i64| json!({"sql": "INSERT INTO t VALUES (?)", "params": [x]});
        unknown(
            &post(&router, "/api/v1/sql", None, &insert(1)).await,
            "a plain write",
        );
        unknown(
            &post(&router, "/api/v1/sql", Some("keyed-1"), &insert(2)).await,
            "a keyed write",
        );
        // An interactive COMMIT runs under the statement timeout PostgreSQL itself enforces: its
        // cancel ends the wait for the standby, and PostgreSQL answers the COMMIT (committed
        // locally, with a warning). Either answer is the truth; "busy, nothing ran" is not.
        let commit = json!({ "transaction": tx });
        let committing = post(&router, "/api/v1/transaction/commit", None, &commit).await;
        if committing.status != 200 {
            unknown(&committing, "an interactive COMMIT");
        }
        standbys(&cluster, &url, None).await;

        // Each was durable on the primary: the unknown outcomes were commits.
        let again = post(&router, "/api/v1/sql", Some("keyed-1"), &insert(2)).await;
        assert_eq!(
            (again.status, again.header("idempotent-replayed")),
            (200, Some("true")),
            "the keyed write's re-send replays it: {}",
            String::from_utf8_lossy(&again.body)
        );
        let mut told = None;
        for _ in 0..100 {
            let reply = post(&router, "/api/v1/transaction/commit", None, &commit).await;
            if reply.status != 503 || reply.code() != "OUTCOME_UNKNOWN" {
                told = Some(reply);
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let told = told.expect("the COMMIT's outcome is known once the database answers again");
        assert_eq!(
            (told.status, told.json()),
            (200, json!({ "outcome": "committed" })),
            "{}",
            String::from_utf8_lossy(&told.body)
        );
        assert_eq!(
            ok(&router, "SELECT x FROM t ORDER BY x", json!([])).await["rows"],
            json!([[1], [2], [3]])
        );
    }
}
