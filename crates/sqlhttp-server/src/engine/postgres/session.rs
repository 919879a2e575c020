//! What a pooled session must be before it serves a request. A client's function may change
//! its session for good, and (as the client role may alter itself) the defaults of every
//! session to come: [`RESET`] undoes the first before each request, [`check_new`] refuses a
//! fresh connection that logged in with defaults a client planted, after removing them.
//!
//! Every name here is schema-qualified: a planted `search_path` must not choose what runs.
//! Knows SQL and tokio-postgres; nothing about requests or HTTP.

use tokio_postgres::Client;

/// Sent before every transaction: undoes whatever a client's function changed in the session
/// for good (settings, the search path, temporary tables that would shadow the next client's,
/// `currval`, prepared statements squatting the driver's statement names, advisory locks, held
/// cursors, listens, a role set with `SET ROLE`), so no request sees what another left behind. The server's own statements
/// never outlive a request, so `DEALLOCATE ALL` takes none of them. It is pipelined with
/// `BEGIN`, in the same round trip: resetting costs no measurable throughput (the load bench),
/// where deadpool's `Clean` recycling, a round trip of its own, cost 15 %.
pub(crate) const RESET: &str = "SET SESSION AUTHORIZATION DEFAULT; RESET ROLE; RESET ALL; \
DISCARD TEMP; DISCARD SEQUENCES; DEALLOCATE ALL; SELECT pg_catalog.pg_advisory_unlock_all(); \
CLOSE ALL; UNLISTEN *;";

/// Role defaults that apply to this session's login (`ALTER ROLE ... SET`, for every database
/// or this one).
const PLANTED: &str = "SELECT pg_catalog.count(*) FROM pg_catalog.pg_db_role_setting AS s \
WHERE s.setrole = (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = SESSION_USER) \
AND s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database AS d \
WHERE d.datname = pg_catalog.current_database()))";

/// Removes the client role's defaults (a role may alter itself).
const REMOVE_PLANTED: &str = "DO $$ BEGIN \
EXECUTE pg_catalog.format('ALTER ROLE %I RESET ALL', SESSION_USER); \
EXECUTE pg_catalog.format('ALTER ROLE %I IN DATABASE %I RESET ALL', SESSION_USER, \
pg_catalog.current_database()); END $$";

/// Checks a connection that just logged in as the client role. With role defaults present
/// (a client ran `ALTER ROLE ... SET`), they are removed and the connection is refused: it
/// already runs with them, while the next one will not. Returns why it was refused.
pub(crate) async fn check_new(client: &Client) -> Result<(), String> {
    // Planted defaults apply to this very session: make sure they cannot stop the check
    // (`default_transaction_read_only`, a tiny `statement_timeout`, a search path). Requests
    // start with RESET ALL, which returns to the login's values.
    client
        .batch_execute(
            "SET default_transaction_read_only = off; SET statement_timeout = '10s'; \
             SET lock_timeout = '10s'; SET idle_in_transaction_session_timeout = 0; \
             SET search_path = pg_catalog, pg_temp",
        )
        .await
        .map_err(|e| format!("cannot prepare a new connection: {e}"))?;
    let planted: i64 = client
        .query_one(PLANTED, &[])
        .await
        .map_err(|e| format!("cannot read the client role's defaults: {e}"))?
        .get(0);
    if planted == 0 {
        return Ok(());
    }
    tracing::warn!(
        "the client role's session defaults were changed (ALTER ROLE ... SET, by a client's \
         function): removed them, and refused the connection that logged in with them"
    );
    client
        .batch_execute(REMOVE_PLANTED)
        .await
        .map_err(|e| format!("cannot remove the client role's planted defaults: {e}"))?;
    Err("the client role's session defaults had been changed; removed".to_owned())
}
