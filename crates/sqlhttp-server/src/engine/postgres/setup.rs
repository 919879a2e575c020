//! Preparing a PostgreSQL database for the server, once at start: the client role
//! `sqlhttp_client` (created when missing, NOLOGIN, no superuser or role rights), the login
//! role's membership in it, its rights on the served schema (`public`), and the idempotency
//! table, which only the login role may touch. Several replicas may start at once: the work
//! runs under an advisory lock.
//!
//! Runs on a thread of its own with a runtime of its own, so the server can be built from sync
//! and async code alike. Knows SQL and tokio-postgres; nothing about requests or HTTP.

use tokio_postgres::NoTls;

use crate::config::PostgresUrl;
use crate::engine::postgres::store;
use crate::error::ServerError;

/// The role client statements run as.
pub(crate) const CLIENT_ROLE: &str = "sqlhttp_client";

/// Serialises the set-up of replicas starting together.
const SETUP_LOCK: i64 = 0x5351_4c48_5454_5001;

const CREATE_ROLE: &str = "DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sqlhttp_client') THEN
        CREATE ROLE sqlhttp_client NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT
            NOREPLICATION NOBYPASSRLS;
    END IF;
END $$";

/// What the operator runs when the server may not do it itself.
const OPERATOR_HINT: &str = "as a superuser, run: CREATE ROLE sqlhttp_client NOLOGIN; \
GRANT sqlhttp_client TO <login role>; GRANT USAGE, CREATE ON SCHEMA public TO sqlhttp_client; \
(see docs/deploy.md, \"PostgreSQL\")";

/// Prepares the database; returns whether the login role is a superuser (worth a warning).
pub(crate) fn prepare(url: &PostgresUrl) -> Result<bool, ServerError> {
    let owned = url.clone();
    std::thread::Builder::new()
        .name("sqlhttpd-pg-setup".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| failed(&owned, format!("cannot start a runtime: {e}")))?;
            runtime.block_on(prepare_on(&owned))
        })
        .map_err(ServerError::EngineThread)?
        .join()
        .unwrap_or_else(|_| Err(failed(url, "the set-up thread panicked".into())))
}

fn failed(url: &PostgresUrl, reason: String) -> ServerError {
    ServerError::Postgres {
        database: url.to_string(),
        reason,
    }
}

async fn prepare_on(url: &PostgresUrl) -> Result<bool, ServerError> {
    let fail = |what: &str, e: tokio_postgres::Error| {
        let detail = e
            .as_db_error()
            .map_or_else(|| e.to_string(), |db| db.message().to_owned());
        failed(url, format!("{what}: {detail}"))
    };
    let (client, connection) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio_postgres::connect(url.secret(), NoTls),
    )
    .await
    .map_err(|_| failed(url, "no answer within 10 s".into()))?
    .map_err(|e| fail("cannot connect", e))?;
    let driver = tokio::spawn(connection);

    client
        .query_one("SELECT pg_advisory_lock($1)", &[&SETUP_LOCK])
        .await
        .map_err(|e| fail("cannot take the set-up lock", e))?;
    let superuser: bool = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(|e| fail("cannot read the login role", e))?
        .get(0);

    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)",
            &[&CLIENT_ROLE],
        )
        .await
        .map_err(|e| fail("cannot read the roles", e))?
        .get(0);
    if !exists && let Err(e) = client.batch_execute(CREATE_ROLE).await {
        // Roles are the cluster's while the set-up lock is one database's: a server starting on
        // another database of the same cluster may have created the role just now.
        let created_meanwhile = e.code().is_some_and(|code| {
            *code == tokio_postgres::error::SqlState::DUPLICATE_OBJECT
                || *code == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
        });
        if !created_meanwhile {
            return Err(failed(
                url,
                format!("cannot create the role {CLIENT_ROLE} ({e}); {OPERATOR_HINT}"),
            ));
        }
    }
    let member: bool = client
        .query_one(
            "SELECT pg_has_role(current_user, $1, 'MEMBER')",
            &[&CLIENT_ROLE],
        )
        .await
        .map_err(|e| fail("cannot read role membership", e))?
        .get(0);
    if !member {
        client
            .batch_execute(&format!("GRANT {CLIENT_ROLE} TO CURRENT_USER"))
            .await
            .map_err(|e| {
                failed(
                    url,
                    format!("cannot join the role {CLIENT_ROLE} ({e}); {OPERATOR_HINT}"),
                )
            })?;
    }
    let may_create: bool = client
        .query_one(
            "SELECT has_schema_privilege($1, 'public', 'CREATE') \
             AND has_schema_privilege($1, 'public', 'USAGE')",
            &[&CLIENT_ROLE],
        )
        .await
        .map_err(|e| fail("cannot read the schema's privileges", e))?
        .get(0);
    if !may_create {
        client
            .batch_execute(&format!(
                "GRANT USAGE, CREATE ON SCHEMA public TO {CLIENT_ROLE}"
            ))
            .await
            .map_err(|e| {
                failed(
                    url,
                    format!(
                        "cannot grant the schema public to {CLIENT_ROLE} ({e}); {OPERATOR_HINT}"
                    ),
                )
            })?;
    }
    client
        .batch_execute(store::TABLE_DDL)
        .await
        .map_err(|e| fail("cannot create the idempotency table", e))?;
    client
        .query_one("SELECT pg_advisory_unlock($1)", &[&SETUP_LOCK])
        .await
        .map_err(|e| fail("cannot release the set-up lock", e))?;
    drop(client);
    let _ = driver.await;
    Ok(superuser)
}
