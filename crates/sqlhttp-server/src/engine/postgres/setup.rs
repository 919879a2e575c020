//! Preparing a PostgreSQL database for the server, once at start, as the `--database` URL's
//! role (the "owner"): the client role (created when missing, LOGIN, with no superuser, role,
//! database, replication or RLS-bypass right), its rights on the served schema (`public`), and
//! the server's store (`keyed::SCHEMA_DDL`: the idempotency table and the functions that reach
//! it, owned by the owner). Returns how to log in as the client role: client statements never
//! run in a session of the owner, so nothing a client runs (not even `RESET ROLE` inside a
//! function of its own) can reach the owner's rights. Several replicas may start at once: the
//! work runs under an advisory lock.
//!
//! A client's function can alter the client role itself (PostgreSQL 15 lets any role change its
//! own password and session defaults, and offers no way to refuse it: ADR 0029). So the server
//! keeps the owner's side at hand, [`RoleKeeper`]: the role's defaults recorded at start (the
//! baseline), the removal of any other default (from an owner connection, the only side that
//! may remove settings the client role cannot reset), and the password put back after a
//! refused login. `temp_file_limit` is the one default an operator may change at any time; the
//! server gives the role it created [`TEMP_FILE_LIMIT`] when nothing limits temporary files.
//!
//! Runs on a thread of its own with a runtime of its own, so the server can be built from sync
//! and async code alike. Knows SQL and tokio-postgres; nothing about requests or HTTP.
//!
//! Past 600 lines on purpose for now: `engine/postgres/` is rebuilt on `sqlhttp-pgwire` by issue 38
//! (ADR 0059), which splits it by concern; issue 39 left this folder as it is.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};

use crate::config::PostgresUrl;
use crate::engine::postgres::keyed;
use crate::engine::postgres::tls::PgTls;
use crate::engine::postgres::wire::{self, Target};
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

/// What temporary files a client statement may write, given to the client role the server
/// created when nothing else limits them (`ALTER ROLE ... SET`): a sort or hash past `work_mem`
/// spills to disk, and one read wrote 3.4 GiB within a 10 s timeout.
pub(crate) const TEMP_FILE_LIMIT: &str = "1GB";

/// The role defaults an operator may set, or change, while the server runs (any value, for
/// every database or this one); every other default must be the baseline's.
const ACCEPTED_SETTINGS: &[&str] = &["temp_file_limit"];

/// What the server runs in every session after each request (and in a new one before its
/// first), and what COMMIT's message checks the transaction with.
///
/// `_sqlhttp.reset_request()` is the session reset's work past its role and settings (see
/// `session::RESET`), one statement for PostgreSQL where it was seven: temporary tables and
/// sequences, statements prepared from SQL text, the seed, advisory locks, held cursors,
/// listens, and the session's read-only default. It has no `SET search_path` clause, on
/// purpose: a function with one puts the caller's settings back when it returns, which would
/// undo its own `SET`; every name in it is qualified instead, and `RESET ALL` runs before it.
/// `_sqlhttp.reset_after_read(seed)` is what is left to reset after a read's `ROLLBACK` (see
/// `session::after_read`): the rollback itself undid the rest.
/// Both close what `dblink` and `postgres_fdw` keep open past a transaction, where an operator
/// installed them (`_sqlhttp.close_links()`, called only then: one index probe of
/// `pg_extension` otherwise): a named or unnamed `dblink_connect` connection would let the next
/// request, whoever sends it, run SQL through it as the role that opened it (ADR 0043).
/// `_sqlhttp.reset_session()` is the form of ADR 0029, kept for servers of an earlier version
/// on the same database. `_sqlhttp.check_transaction(opened)` raises `SQLHT` when the
/// transaction it runs in did not start at `opened` (read at BEGIN).
/// `_sqlhttp.check_wrote_nothing()` raises `SQLHW` unless a `COMMIT` of the transaction it runs
/// in can keep nothing a statement wrote (ADR 0069: no transaction id, no held cursor, no
/// foreign table); a function, so its plans are cached for the session where the same
/// query sent as the unnamed statement was planned on every request.
///
/// `_sqlhttp.reset_session()`: forgets what a
/// client left in the session that `RESET ALL` and `DISCARD` do not (see `session::RESET`),
/// as the client role, in its own session. `DEALLOCATE ALL` would drop the statements
/// tokio-postgres prepared to look types up (it keeps them for the connection's life), so only
/// statements prepared from SQL text go (`PREPARE`, which a client's function can run; the
/// driver's come from the protocol). `setseed()` lasts for the session and nothing resets it:
/// the seed is drawn again from PostgreSQL's strong random source (`gen_random_uuid`).
const SESSION_DDL: &str = "CREATE OR REPLACE FUNCTION _sqlhttp.reset_session() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    statement text;
BEGIN
    FOR statement IN SELECT p.name FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql
    LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', statement);
    END LOOP;
    PERFORM pg_catalog.setseed(pg_catalog.float8div(
        pg_catalog.hashtextextended(pg_catalog.gen_random_uuid()::pg_catalog.text, 0)
            ::pg_catalog.float8,
        9223372036854775807::pg_catalog.float8));
END $$;
REVOKE ALL ON FUNCTION _sqlhttp.reset_session() FROM PUBLIC;
CREATE OR REPLACE FUNCTION _sqlhttp.check_transaction(opened pg_catalog.numeric) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp()) IS DISTINCT FROM opened THEN
        RAISE EXCEPTION 'not the transaction the server opened' USING ERRCODE = 'SQLHT';
    END IF;
END $$;
REVOKE ALL ON FUNCTION _sqlhttp.check_transaction(pg_catalog.numeric) FROM PUBLIC;
CREATE OR REPLACE FUNCTION _sqlhttp.close_links() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    home text;
    link text;
BEGIN
    SELECT n.nspname INTO home FROM pg_catalog.pg_extension AS e
        JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
        WHERE e.extname OPERATOR(pg_catalog.=) 'dblink';
    IF home IS NOT NULL AND pg_catalog.has_function_privilege(
            pg_catalog.format('%I.dblink_get_connections()', home), 'EXECUTE') THEN
        FOR link IN EXECUTE pg_catalog.format(
                'SELECT pg_catalog.unnest(%I.dblink_get_connections())', home) LOOP
            EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', home) USING link;
        END LOOP;
        BEGIN
            EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect()', home);
        EXCEPTION WHEN connection_does_not_exist THEN NULL;
        END;
    END IF;
    home := NULL;
    SELECT n.nspname INTO home FROM pg_catalog.pg_extension AS e
        JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
        WHERE e.extname OPERATOR(pg_catalog.=) 'postgres_fdw';
    IF home IS NOT NULL AND pg_catalog.to_regprocedure(
            pg_catalog.format('%I.postgres_fdw_disconnect_all()', home)) IS NOT NULL
        AND pg_catalog.has_function_privilege(
            pg_catalog.format('%I.postgres_fdw_disconnect_all()', home), 'EXECUTE') THEN
        EXECUTE pg_catalog.format('SELECT %I.postgres_fdw_disconnect_all()', home);
    END IF;
END $$;
REVOKE ALL ON FUNCTION _sqlhttp.close_links() FROM PUBLIC;
CREATE OR REPLACE FUNCTION _sqlhttp.reset_request() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    statement text;
BEGIN
    DISCARD TEMP;
    DISCARD SEQUENCES;
    FOR statement IN SELECT p.name FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql
    LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', statement);
    END LOOP;
    PERFORM pg_catalog.setseed(pg_catalog.float8div(
        pg_catalog.hashtextextended(pg_catalog.gen_random_uuid()::pg_catalog.text, 0)
            ::pg_catalog.float8,
        9223372036854775807::pg_catalog.float8));
    PERFORM pg_catalog.pg_advisory_unlock_all();
    EXECUTE 'CLOSE ALL';
    UNLISTEN *;
    SET default_transaction_read_only = on;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e
               WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN
        PERFORM _sqlhttp.close_links();
    END IF;
END $$;
REVOKE ALL ON FUNCTION _sqlhttp.reset_request() FROM PUBLIC;
CREATE OR REPLACE FUNCTION _sqlhttp.reset_after_read(seed pg_catalog.float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    statement text;
BEGIN
    FOR statement IN SELECT p.name FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql
    LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', statement);
    END LOOP;
    PERFORM pg_catalog.setseed(seed);
    PERFORM pg_catalog.pg_advisory_unlock_all();
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e
               WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN
        PERFORM _sqlhttp.close_links();
    END IF;
END $$;
REVOKE ALL ON FUNCTION _sqlhttp.reset_after_read(pg_catalog.float8) FROM PUBLIC;
CREATE OR REPLACE FUNCTION _sqlhttp.check_wrote_nothing() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL
        OR EXISTS (SELECT FROM pg_catalog.pg_cursors AS c WHERE c.is_holdable)
        OR EXISTS (SELECT FROM pg_catalog.pg_foreign_table) THEN
        RAISE EXCEPTION 'the transaction may keep a write at COMMIT' USING ERRCODE = 'SQLHW';
    END IF;
END $$;
REVOKE ALL ON FUNCTION _sqlhttp.check_wrote_nothing() FROM PUBLIC;";

/// The client role's defaults that apply to a session of this database (`$1` the role).
const ROLE_SETTINGS: &str = "SELECT s.setdatabase <> 0, c.entry \
FROM pg_catalog.pg_db_role_setting AS s \
CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS c(entry) \
WHERE s.setrole = (SELECT r.oid FROM pg_catalog.pg_roles AS r \
WHERE r.rolname = $1::pg_catalog.name) \
AND s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database AS d \
WHERE d.datname = pg_catalog.current_database())) ORDER BY 1, 2";

/// One of the client role's defaults (`ALTER ROLE ... [IN DATABASE ...] SET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoleSetting {
    /// For this database only (else for every database).
    in_database: bool,
    /// `name=value`, as PostgreSQL keeps it.
    entry: String,
}

impl RoleSetting {
    /// The setting's name.
    pub(crate) fn name(&self) -> &str {
        self.entry
            .split_once('=')
            .map_or(&self.entry, |(name, _)| name)
    }

    fn accepted(&self) -> bool {
        ACCEPTED_SETTINGS
            .iter()
            .any(|name| self.name().eq_ignore_ascii_case(name))
    }
}

/// The client role's defaults that apply in this database; `client` may be any role's session
/// with `search_path` pinned to `pg_catalog`.
pub(crate) async fn role_settings(
    client: &Client,
    role: &str,
) -> Result<Vec<RoleSetting>, tokio_postgres::Error> {
    Ok(client
        .query(ROLE_SETTINGS, &[&role])
        .await?
        .iter()
        .map(|row| RoleSetting {
            in_database: row.get(0),
            entry: row.get(1),
        })
        .collect())
}

/// `name` as an SQL identifier, always quoted.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Resets `settings` of `role` from `owner`'s session; returns what could not be reset, with
/// PostgreSQL's reason. A setting of a library the owner's session has not loaded (a
/// placeholder such as `pg_trgm.similarity_threshold`) or one only superusers may set
/// (`temp_file_limit`) can only be reset by a superuser.
async fn reset_settings(owner: &Client, role: &str, settings: &[RoleSetting]) -> Vec<String> {
    let mut failed = Vec::new();
    let database = match owner
        .query_one("SELECT pg_catalog.current_database()::pg_catalog.text", &[])
        .await
    {
        Ok(row) => row.get::<_, String>(0),
        Err(e) => return vec![format!("cannot read the database's name: {}", detail(&e))],
    };
    for setting in settings {
        // `a.b` is two identifiers; quoting each keeps any name one setting's name.
        let name = setting
            .name()
            .split('.')
            .map(quoted)
            .collect::<Vec<_>>()
            .join(".");
        let scope = if setting.in_database {
            format!(" IN DATABASE {}", quoted(&database))
        } else {
            String::new()
        };
        let reset = format!("ALTER ROLE {}{scope} RESET {name}", quoted(role));
        if let Err(e) = owner.batch_execute(&reset).await {
            failed.push(format!("{}: {}", setting.name(), detail(&e)));
        }
    }
    failed
}

/// The owner's side of the client role, kept while the server runs: what the role's defaults
/// were at start, and how to put the role back when a client changed it.
pub(crate) struct RoleKeeper {
    /// How to log in as the owner (the `--database` URL).
    owner: Target,
    role: String,
    /// The client role's password (this database's secret).
    password: String,
    /// The role's defaults once the start was done with them.
    baseline: Vec<RoleSetting>,
    /// When the password was last put back: at most once a [`RESTORE_EVERY`].
    restored_at: tokio::sync::Mutex<Option<Instant>>,
}

/// The least time between two restores of the password: a login that still fails after one
/// (`pg_hba.conf`, say) must not cost an owner connection per request.
const RESTORE_EVERY: Duration = Duration::from_secs(1);

impl std::fmt::Debug for RoleKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleKeeper")
            .field("role", &self.role)
            .field("baseline", &self.baseline.len())
            .finish_non_exhaustive()
    }
}

impl RoleKeeper {
    /// The client role's name.
    pub(crate) fn role(&self) -> &str {
        &self.role
    }

    /// Of the role's defaults `now`, those the server did not start with and does not accept.
    pub(crate) fn planted(&self, now: &[RoleSetting]) -> Vec<RoleSetting> {
        now.iter()
            .filter(|setting| !setting.accepted() && !self.baseline.contains(setting))
            .cloned()
            .collect()
    }

    /// Whether a session may run with the role default `name` it logged in with: a setting the
    /// server accepts (`temp_file_limit`) or one of the baseline's.
    pub(crate) fn accepts_default(&self, name: &str) -> bool {
        ACCEPTED_SETTINGS
            .iter()
            .chain(
                self.baseline
                    .iter()
                    .map(RoleSetting::name)
                    .collect::<Vec<_>>()
                    .iter(),
            )
            .any(|accepted| accepted.eq_ignore_ascii_case(name))
    }

    /// An owner session with the search path pinned (see [`prepare_on`]), whose statements
    /// cannot wait long (an `ALTER ROLE` waits for a client's transaction that altered the role).
    async fn owner(&self) -> Result<Client, String> {
        let owner = connect(&self.owner).await?;
        owner
            .batch_execute("SET search_path = pg_catalog, pg_temp; SET statement_timeout = '10s'")
            .await
            .map_err(|e| detail(&e))?;
        Ok(owner)
    }

    /// Removes `planted` from the role, from an owner connection. On `Err`, what could not be
    /// removed and why.
    pub(crate) async fn remove(&self, planted: &[RoleSetting]) -> Result<(), String> {
        let owner = self
            .owner()
            .await
            .map_err(|e| format!("cannot connect as the --database role: {e}"))?;
        let failed = reset_settings(&owner, &self.role, planted).await;
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }

    /// Puts the role's password back after a login refused for its password (a client's
    /// function ran `ALTER ROLE CURRENT_USER PASSWORD ...`): the client's password no longer
    /// logs in, the server's does again. Only for a role this database's server created
    /// (another database's is that server's to keep). Whether a login is worth retrying.
    /// How to log in as the owner (the `--database` URL's role).
    pub(crate) fn owner_target(&self) -> Target {
        Target {
            config: self.owner.config.clone(),
            tls: std::sync::Arc::clone(&self.owner.tls),
        }
    }

    pub(crate) async fn restore_password(&self) -> bool {
        let mut restored_at = self.restored_at.lock().await;
        if restored_at.is_some_and(|at| at.elapsed() < RESTORE_EVERY) {
            // Another request has just put it back.
            return true;
        }
        *restored_at = Some(Instant::now());
        let restored = async {
            let owner = self.owner().await?;
            if !is_ours(&owner, &self.role).await.map_err(|e| detail(&e))? {
                return Err(format!(
                    "{} was not created by this database's server; give it its password \
                     again (docs/deploy.md, \"PostgreSQL\")",
                    self.role
                ));
            }
            set_password(&owner, &self.role, &self.password)
                .await
                .map_err(|e| detail(&e))
        };
        match restored.await {
            Ok(()) => {
                tracing::warn!(
                    role = %self.role,
                    "the client role's password was changed (ALTER ROLE ... PASSWORD, by a \
                     client's function): the server refused to log in, so it put its own \
                     password back from the --database role's connection"
                );
                true
            }
            Err(why) => {
                tracing::error!(
                    role = %self.role,
                    error = %why,
                    "the client role's password is not the server's, and it cannot be put back"
                );
                false
            }
        }
    }
}

/// What the server needs to serve clients, once the database is prepared.
pub(crate) struct Prepared {
    /// How to log in as the client role: the `--database` URL's host, port and database, the
    /// client role, and its password.
    pub(crate) client: Config,
    /// The URL's TLS settings, for every connection (see `tls`).
    pub(crate) tls: std::sync::Arc<PgTls>,
    /// The key the store's functions ask for (see `keyed`).
    pub(crate) store_key: String,
    /// The owner's side of the client role.
    pub(crate) keeper: std::sync::Arc<RoleKeeper>,
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
        return super::errors::bounded(db.message());
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

async fn connect(target: &Target) -> Result<Client, String> {
    let (client, _driver) = tokio::time::timeout(CONNECT_WITHIN, wire::connect(target))
        .await
        .map_err(|_| format!("no answer within {} s", CONNECT_WITHIN.as_secs()))?
        .map_err(|e| match target.tls.hint(&e) {
            Some(hint) => format!("{}; {hint}", detail(&e)),
            None => detail(&e),
        })?;
    Ok(client)
}

async fn prepare_on(url: &PostgresUrl) -> Result<Prepared, ServerError> {
    let role = url.client_role();
    let fail =
        |what: &str, e: tokio_postgres::Error| failed(url, format!("{what}: {}", detail(&e)));
    let mut owner_config: Config = url
        .secret()
        .parse()
        .map_err(|e: tokio_postgres::Error| failed(url, e.to_string()))?;
    // TLS is `tls`'s, on the socket, before the driver sees it.
    owner_config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    let tls = std::sync::Arc::new(PgTls::new(url.ssl()).map_err(|e| failed(url, e))?);
    let owner_target = Target {
        config: owner_config.clone(),
        tls: std::sync::Arc::clone(&tls),
    };
    let owner = connect(&owner_target)
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
    keyed::create(&owner)
        .await
        .map_err(|e| fail("cannot create the server's schema _sqlhttp", e))?;
    let (password, store_key) = keyed::secrets(&owner)
        .await
        .map_err(|e| fail("cannot read the server's secrets", e))?;
    keyed::create_peer_secret(&owner)
        .await
        .map_err(|e| fail("cannot store the peer secret", e))?;
    ensure_client_role(&owner, url, &password).await?;
    keyed::grant(&owner, role)
        .await
        .map_err(|e| fail(&format!("cannot let {role} call the store"), e))?;
    owner
        .batch_execute(&format!(
            "{SESSION_DDL} GRANT EXECUTE ON FUNCTION _sqlhttp.reset_session() TO {role}; \
             GRANT EXECUTE ON FUNCTION _sqlhttp.check_transaction(pg_catalog.numeric) TO {role}; \
             GRANT EXECUTE ON FUNCTION _sqlhttp.close_links() TO {role}; \
             GRANT EXECUTE ON FUNCTION _sqlhttp.reset_request() TO {role}; \
             GRANT EXECUTE ON FUNCTION _sqlhttp.reset_after_read(pg_catalog.float8) TO {role}; \
             GRANT EXECUTE ON FUNCTION _sqlhttp.check_wrote_nothing() TO {role}"
        ))
        .await
        .map_err(|e| fail("cannot create the server's session reset", e))?;
    grant_public_schema(&owner, url).await?;
    let mut client = owner_config.clone();
    client.user(role).password(password.clone());
    let temp_file_limit = check_client_login(
        &Target {
            config: client.clone(),
            tls: std::sync::Arc::clone(&tls),
        },
        url,
    )
    .await?;
    if temp_file_limit == "-1" {
        limit_temp_files(&owner, role).await;
    }
    let baseline = role_settings(&owner, role)
        .await
        .map_err(|e| fail("cannot read the client role's defaults", e))?;
    owner
        .query_one("SELECT pg_advisory_unlock($1)", &[&SETUP_LOCK])
        .await
        .map_err(|e| fail("cannot release the set-up lock", e))?;
    drop(owner);
    if !baseline.is_empty() {
        let names: Vec<&str> = baseline.iter().map(RoleSetting::name).collect();
        tracing::info!(
            role,
            defaults = %names.join(", "),
            "the client role's defaults at start: the server keeps them (and removes any other)"
        );
    }
    let keeper = RoleKeeper {
        owner: owner_target,
        role: role.to_owned(),
        password,
        baseline,
        restored_at: tokio::sync::Mutex::new(None),
    };
    Ok(Prepared {
        client,
        tls,
        store_key,
        keeper: std::sync::Arc::new(keeper),
    })
}

/// Gives the client role the server created [`TEMP_FILE_LIMIT`] (`ALTER ROLE ... SET`: an
/// operator's `ALTER ROLE ... SET` replaces it, and `... IN DATABASE ... SET` wins over it); says
/// what to do when it cannot (another's role, an owner that is not a superuser:
/// `temp_file_limit` is a superuser's setting).
async fn limit_temp_files(owner: &Client, role: &str) {
    let limited = async {
        if !is_ours(owner, role).await? {
            return Ok(false);
        }
        owner
            .batch_execute(&format!(
                "ALTER ROLE {} SET temp_file_limit = '{TEMP_FILE_LIMIT}'",
                quoted(role)
            ))
            .await
            .map(|()| true)
    };
    let fix = format!(
        "as a superuser, run ALTER ROLE {role} SET temp_file_limit = '{TEMP_FILE_LIMIT}' \
         (docs/deploy.md)"
    );
    match limited.await {
        Ok(true) => tracing::info!(
            role,
            limit = TEMP_FILE_LIMIT,
            "temporary files of client statements limited (temp_file_limit)"
        ),
        Ok(false) => tracing::warn!(
            role,
            "temporary files of client statements are unlimited: {fix}"
        ),
        Err(e) => tracing::warn!(
            role,
            error = %detail(&e),
            "temporary files of client statements are unlimited, and the --database role cannot \
             limit them: {fix}"
        ),
    }
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

/// Whether `role` is the one this database's server created (marked by its comment).
async fn is_ours(owner: &Client, role: &str) -> Result<bool, tokio_postgres::Error> {
    let marker = marker(owner).await?;
    Ok(owner
        .query_one(
            "SELECT pg_catalog.shobj_description(r.oid, 'pg_authid') IS NOT DISTINCT FROM $2 \
             FROM pg_catalog.pg_roles AS r WHERE r.rolname = $1::name",
            &[&role, &marker],
        )
        .await?
        .get(0))
}

/// Gives `role` `password` (only its SCRAM verifier is sent).
async fn set_password(
    owner: &Client,
    role: &str,
    password: &str,
) -> Result<(), tokio_postgres::Error> {
    let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
    owner
        .batch_execute(&format!(
            "ALTER ROLE {} PASSWORD '{verifier}'",
            quoted(role)
        ))
        .await
}

/// A client may change its own role: its password (then it could log in without the server,
/// and the server could not) and its session defaults (then every new session of every client
/// starts with them, `search_path` included). At each start, a role this database's server
/// created gets its password back, and loses every default but `temp_file_limit` (an
/// operator's); another database's role is left alone, and its defaults are the baseline.
async fn restore_if_ours(owner: &Client, role: &str, password: &str) {
    let restore = async {
        if !is_ours(owner, role).await? {
            return Ok(Vec::new());
        }
        let planted: Vec<RoleSetting> = role_settings(owner, role)
            .await?
            .into_iter()
            .filter(|setting| !setting.accepted())
            .collect();
        let failed = reset_settings(owner, role, &planted).await;
        set_password(owner, role, password).await?;
        Ok(failed)
    };
    match restore.await {
        Ok(failed) if failed.is_empty() => {}
        Ok(failed) => tracing::warn!(
            role,
            failed = %failed.join("; "),
            "cannot remove some of the client role's defaults (a superuser can: ALTER ROLE ... \
             RESET ...); the server keeps them"
        ),
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
/// Returns the `temp_file_limit` its sessions start with (`-1`: unlimited).
async fn check_client_login(client: &Target, url: &PostgresUrl) -> Result<String, ServerError> {
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
    let limit = session
        .query_one(
            "SELECT pg_catalog.current_setting('temp_file_limit')::pg_catalog.text",
            &[],
        )
        .await
        .map_err(|e| {
            failed(
                url,
                format!("the client role cannot run a statement: {}", detail(&e)),
            )
        })?;
    Ok(limit.get(0))
}
