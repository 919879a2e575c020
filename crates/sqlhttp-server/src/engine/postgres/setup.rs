//! Preparing a PostgreSQL database for the server, once at start, as the `--database` URL's
//! role (the "owner"): the client role (created when missing, LOGIN, with no superuser, role,
//! database, replication or RLS-bypass right), its rights on the served schema (`public`), and
//! the server's store (`store::SCHEMA_DDL`: the idempotency table and the functions that reach
//! it, owned by the owner). Returns how to log in as the client role: client statements never
//! run in a session of the owner, so nothing a client runs (not even `RESET ROLE` inside a
//! function of its own) can reach the owner's rights. Several replicas may start at once: the
//! work runs under an advisory lock.
//!
//! Runs on a thread of its own with a runtime of its own, so the server can be built from sync
//! and async code alike. Knows SQL and tokio-postgres; nothing about requests or HTTP.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use crate::config::PostgresUrl;
use crate::engine::postgres::store;
use crate::error::ServerError;

/// Serialises the set-up of replicas starting together.
const SETUP_LOCK: i64 = 0x5351_4c48_5454_5001;

/// How long connecting may take at start.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// Built-in roles whose members reach the server's files or programs.
const SERVER_FILE_ROLES: &[&str] = &[
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_execute_server_program",
];

/// What the server needs to serve clients, once the database is prepared.
pub(crate) struct Prepared {
    /// How to log in as the client role: the `--database` URL's host, port and database, the
    /// client role, and its password.
    pub(crate) client: Config,
    /// The key the store's functions ask for (see `store`).
    pub(crate) store_key: String,
}

/// Prepares the database and checks that the client role can log in.
pub(crate) fn prepare(url: &PostgresUrl) -> Result<Prepared, ServerError> {
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

/// PostgreSQL's own words for a failure (its message, never its DETAIL, which may quote
/// values), or the driver's with its causes ("error connecting to server: failed to lookup
/// address information: ...").
fn detail(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return super::sqlstate::bounded(db.message());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(inner) = cause {
        let said = inner.to_string();
        if !text.ends_with(&said) {
            text = format!("{text}: {said}");
        }
        cause = inner.source();
    }
    text
}

async fn connect(config: &Config) -> Result<Client, String> {
    let (client, connection) = tokio::time::timeout(CONNECT_WITHIN, config.connect(NoTls))
        .await
        .map_err(|_| format!("no answer within {} s", CONNECT_WITHIN.as_secs()))?
        .map_err(|e| detail(&e))?;
    tokio::spawn(connection);
    Ok(client)
}

async fn prepare_on(url: &PostgresUrl) -> Result<Prepared, ServerError> {
    let role = url.client_role();
    let fail =
        |what: &str, e: tokio_postgres::Error| failed(url, format!("{what}: {}", detail(&e)));
    let owner_config: Config = url
        .secret()
        .parse()
        .map_err(|e: tokio_postgres::Error| failed(url, e.to_string()))?;
    let owner = connect(&owner_config)
        .await
        .map_err(|e| failed(url, format!("cannot connect: {e}")))?;
    // Clients may create functions in `public`, and an unqualified call resolves to the best
    // match along the search path: `public.pg_has_role(text, text, text)` would beat the
    // built-in and run with the owner's rights. The owner's session sees pg_catalog only.
    owner
        .batch_execute("SET search_path = pg_catalog, pg_temp")
        .await
        .map_err(|e| fail("cannot pin the search path", e))?;
    let me: String = owner
        .query_one("SELECT current_user::text", &[])
        .await
        .map_err(|e| fail("cannot read the login role", e))?
        .get(0);
    if me == role {
        return Err(failed(
            url,
            format!(
                "the URL logs in as the client role {role}: give the URL of the role that owns \
                 the database (it prepares it, and never runs client statements), or another \
                 --client-role"
            ),
        ));
    }

    owner
        .query_one("SELECT pg_advisory_lock($1)", &[&SETUP_LOCK])
        .await
        .map_err(|e| fail("cannot take the set-up lock", e))?;
    store::create(&owner)
        .await
        .map_err(|e| fail("cannot create the server's schema _sqlhttp", e))?;
    let (password, store_key) = store::secrets(&owner)
        .await
        .map_err(|e| fail("cannot read the server's secrets", e))?;
    ensure_client_role(&owner, url, &password).await?;
    store::grant(&owner, role)
        .await
        .map_err(|e| fail(&format!("cannot let {role} call the store"), e))?;
    grant_public_schema(&owner, url).await?;
    owner
        .query_one("SELECT pg_advisory_unlock($1)", &[&SETUP_LOCK])
        .await
        .map_err(|e| fail("cannot release the set-up lock", e))?;
    drop(owner);

    let mut client = owner_config;
    client.user(role).password(password);
    check_client_login(&client, url).await?;
    Ok(Prepared { client, store_key })
}

/// Creates the client role when missing (with this database's password), and refuses one that
/// holds rights a client must not have.
async fn ensure_client_role(
    owner: &Client,
    url: &PostgresUrl,
    password: &str,
) -> Result<(), ServerError> {
    let role = url.client_role();
    let exists = owner
        .query_opt(
            "SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls, \
                    rolcanlogin \
             FROM pg_roles WHERE rolname = $1",
            &[&role],
        )
        .await
        .map_err(|e| failed(url, format!("cannot read the roles: {}", detail(&e))))?;
    let Some(existing) = exists else {
        let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
        let created = owner
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN PASSWORD '{verifier}' NOSUPERUSER NOCREATEDB \
                 NOCREATEROLE NOREPLICATION NOBYPASSRLS"
            ))
            .await;
        return match created {
            Ok(()) => mark_as_ours(owner, role)
                .await
                .map_err(|e| failed(url, format!("cannot mark the client role: {}", detail(&e)))),
            // Roles are the cluster's while the set-up lock is one database's: a server
            // starting on another database of the cluster may have created it just now. Its
            // password is then that database's: the login check says so.
            Err(e)
                if e.code() == Some(&SqlState::DUPLICATE_OBJECT)
                    || e.code() == Some(&SqlState::UNIQUE_VIOLATION) =>
            {
                Ok(())
            }
            Err(e) => Err(failed(
                url,
                format!(
                    "cannot create the client role {role} ({}): the --database role needs \
                     CREATEROLE (or superuser) the first time (docs/deploy.md, \"PostgreSQL\")",
                    detail(&e)
                ),
            )),
        };
    };
    let (privileged, can_login): (bool, bool) = (existing.get(0), existing.get(1));
    let server_files: bool = owner
        .query_one(
            "SELECT pg_catalog.bool_or(pg_catalog.pg_has_role($1::name, r::name, 'USAGE'::text)) \
             FROM pg_catalog.unnest($2::text[]) AS r",
            &[&role, &SERVER_FILE_ROLES],
        )
        .await
        .map_err(|e| failed(url, format!("cannot read role memberships: {}", detail(&e))))?
        .get(0);
    if privileged || server_files {
        return Err(failed(
            url,
            format!(
                "the client role {role} has rights a client must not have (superuser, \
                 CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS, or a pg_*_server_files/program \
                 role): every client statement would have them; take them away, or give \
                 another --client-role"
            ),
        ));
    }
    if !can_login {
        return Err(failed(
            url,
            format!(
                "the client role {role} exists but may not log in: client statements log in as \
                 it (ALTER ROLE {role} LOGIN, or give another --client-role)"
            ),
        ));
    }
    restore_if_ours(owner, role, password).await;
    Ok(())
}

/// The comment that marks a client role as this database's server's.
async fn marker(owner: &Client) -> Result<String, tokio_postgres::Error> {
    let database: String = owner
        .query_one("SELECT pg_catalog.current_database()::text", &[])
        .await?
        .get(0);
    Ok(format!("sqlhttpd client role of database {database}"))
}

async fn mark_as_ours(owner: &Client, role: &str) -> Result<(), tokio_postgres::Error> {
    let marker = marker(owner).await?;
    let comment: String = owner
        .query_one(
            "SELECT pg_catalog.format('COMMENT ON ROLE %I IS %L', $1::text, $2::text)",
            &[&role, &marker],
        )
        .await?
        .get(0);
    owner.batch_execute(&comment).await
}

/// A client may change its own role: its password (then it could log in without the server,
/// and the server could not) and its session defaults (then every new session of every client
/// starts with them, `search_path` included). At each start, a role this database's server
/// created gets its password and defaults back; another database's role is left alone.
async fn restore_if_ours(owner: &Client, role: &str, password: &str) {
    let restore = async {
        let marker = marker(owner).await?;
        let ours: bool = owner
            .query_one(
                "SELECT pg_catalog.shobj_description(r.oid, 'pg_authid') IS NOT DISTINCT FROM $2 \
                 FROM pg_catalog.pg_roles AS r WHERE r.rolname = $1::name",
                &[&role, &marker],
            )
            .await?
            .get(0);
        if !ours {
            return Ok(false);
        }
        let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
        let in_database: String = owner
            .query_one(
                "SELECT pg_catalog.format('ALTER ROLE %I IN DATABASE %I RESET ALL', $1::text, \
                 pg_catalog.current_database())",
                &[&role],
            )
            .await?
            .get(0);
        owner
            .batch_execute(&format!(
                "ALTER ROLE {role} RESET ALL; {in_database}; ALTER ROLE {role} PASSWORD '{verifier}'"
            ))
            .await
            .map(|()| true)
    };
    match restore.await {
        Ok(_) => {}
        Err(e) => tracing::warn!(
            role,
            error = %detail(&e),
            "cannot restore the client role's password and defaults"
        ),
    }
}

/// Lets the client role use and create in schema `public`, unless it already may.
async fn grant_public_schema(owner: &Client, url: &PostgresUrl) -> Result<(), ServerError> {
    let role = url.client_role();
    let may_create: bool = owner
        .query_one(
            "SELECT pg_catalog.has_schema_privilege($1::name, 'public'::text, 'CREATE'::text) \
             AND pg_catalog.has_schema_privilege($1::name, 'public'::text, 'USAGE'::text)",
            &[&role],
        )
        .await
        .map_err(|e| {
            failed(
                url,
                format!("cannot read the schema's privileges: {}", detail(&e)),
            )
        })?
        .get(0);
    if may_create {
        return Ok(());
    }
    owner
        .batch_execute(&format!("GRANT USAGE, CREATE ON SCHEMA public TO {role}"))
        .await
        .map_err(|e| {
            failed(
                url,
                format!(
                    "cannot grant the schema public to {role} ({}): as its owner, run GRANT \
                     USAGE, CREATE ON SCHEMA public TO {role}",
                    detail(&e)
                ),
            )
        })
}

/// Logs in as the client role once, so a refused login fails the start, not every request.
async fn check_client_login(client: &Config, url: &PostgresUrl) -> Result<(), ServerError> {
    let role = url.client_role();
    let session = connect(client).await.map_err(|e| {
        failed(
            url,
            format!(
                "cannot log in as the client role {role} ({e}): pg_hba.conf must let {role} \
                 connect as it lets the --database role; if {role} was created for another \
                 database of this cluster (its password is that database's), give this server \
                 another --client-role"
            ),
        )
    })?;
    session.query_one("SELECT 1", &[]).await.map_err(|e| {
        failed(
            url,
            format!("the client role cannot run a statement: {}", detail(&e)),
        )
    })?;
    Ok(())
}
