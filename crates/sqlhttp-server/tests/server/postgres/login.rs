//! How the server logs in to PostgreSQL: a bad URL or an unreachable database fails at start;
//! the client role is created (or the operator's checked: no rights a client must not have, and
//! able to log in), never the URL's own; under SCRAM its password is kept in the database, again
//! after a restart, and a second database cannot share the role. The role's defaults and
//! password while the server runs are `postgres/session.rs`.

use std::process::Command;

use serde_json::json;
use sqlhttp_server::{AppState, Config, Limits, app};

use crate::common::ok;
use crate::engines::{database, database_on, needs_postgres, password_cluster, with_role};

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

needs_postgres! {
    /// The login path as production runs it: on a cluster that asks every role but `postgres` for
    /// its SCRAM password, the server logs in as the client role it created, with the password
    /// kept in the database, again after a restart; a second database cannot share that role, and
    /// says so at start.
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
}

needs_postgres! {
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
}
