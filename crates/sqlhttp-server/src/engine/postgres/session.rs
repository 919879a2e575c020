//! What a pooled session must be before it serves a request. A client's function may change
//! its session for good, and (as the client role may alter itself) the defaults of every
//! session to come, and its password: [`RESET`] undoes the first before each request;
//! [`check_new`] has the owner remove defaults a client planted (anything the role did not
//! start with, but `temp_file_limit`) and refuses the fresh connection that logged in with
//! them; [`worth_retrying`] tells the engine when a failed connection is worth one more try
//! (after that refusal, or after the password was put back: see `setup::RoleKeeper`).
//!
//! Every name here is schema-qualified: a planted `search_path` must not choose what runs.
//! Knows SQL, tokio-postgres and the pool's errors; nothing about requests or HTTP.

use deadpool_postgres::{HookError, PoolError};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::setup::{self, RoleKeeper};

/// The text of [`RESET`], for the consts built from it.
macro_rules! reset_text {
    () => {
        "SET SESSION AUTHORIZATION DEFAULT; RESET ROLE; RESET ALL; \
         SELECT _sqlhttp.reset_request();"
    };
}

/// Sent after every request's transaction ends, in the same round trip (and before a new
/// session's first request): undoes whatever a client's function changed in the session
/// for good (settings, the search path, temporary tables that would shadow the next client's,
/// `currval`, prepared statements squatting the driver's statement names, advisory locks, held
/// cursors, listens, a role set with `SET ROLE`, the random seed), so no request sees what
/// another left behind. Not `DEALLOCATE ALL`: tokio-postgres keeps the statements that look
/// user-defined types up for the connection's life (and the engine's cache of client
/// statements: ADR 0034), so `_sqlhttp.reset_request()` drops only the statements prepared from
/// SQL text; it does the rest in one statement, and reseeds `random()` (see `setup`). The role
/// is reset before it is called (a role set with `SET ROLE` may not call it). It runs outside
/// any transaction (a rollback would undo its transactional parts: `UNLISTEN`, `DISCARD
/// TEMP`), pipelined with `COMMIT` or `ROLLBACK` in one write; a session whose reset failed is
/// closed, not pooled, so a pooled session is always a reset one (ADR 0034). It leaves the
/// session read-only by default: only the server's `BEGIN READ WRITE` opens a transaction that
/// writes, so a statement written behind a `BEGIN` that failed cannot write in autocommit.
pub(crate) const RESET: &str = reset_text!();

/// [`RESET`]'s statements one by one, for a flight of the extended protocol, which takes one
/// statement per `Parse`. Run there in the flight's implicit transaction, committed at its
/// `Sync`; an error anywhere rolls all of them back, and the session is closed, not pooled.
pub(crate) const RESET_STATEMENTS: [&str; 4] = [
    "SET SESSION AUTHORIZATION DEFAULT",
    "RESET ROLE",
    "RESET ALL",
    "SELECT _sqlhttp.reset_request()",
];

/// The end of a read's transaction and what is left of the session's reset after it, as one
/// simple query: the engine writes it behind the read's statement before any of the
/// statement's answer arrived, so the read takes one round trip (ADR 0037).
///
/// `ROLLBACK` ends the server's transaction whatever the statement did (it failed, or wrote
/// nothing: the transaction is `READ ONLY`), and warns only when there was none (a `BEGIN`
/// that never ran). The rollback undoes most of what [`RESET`] is for: settings and the search
/// path set in the transaction, `SET ROLE`, listens and held cursors all go with it (checked by
/// `tests/server/postgres/reset.rs`), and a `READ ONLY` transaction cannot create temporary tables or
/// advance sequences. What outlives a rollback is reset after it, outside the transaction, by
/// `_sqlhttp.reset_after_read`: statements a client's function prepared from SQL text, the
/// random seed (drawn here, from the server's CSPRNG), and session advisory locks. A failure
/// anywhere in the string leaves the session unclean: it is closed, not pooled, as for
/// [`RESET`].
pub(crate) fn after_read() -> String {
    let seed = seed();
    format!("ROLLBACK; SELECT _sqlhttp.reset_after_read({seed}::pg_catalog.float8)")
}

/// The random seed of a read's reset, as the text of a `float8`: in (-1, 1), what `setseed`
/// takes, drawn afresh from the server's CSPRNG so no client can know the next. Written as a
/// sign and sixteen decimal digits, not through a float's formatting, which cost a read more
/// than the rest of its reset's text (ADR 0073).
pub(crate) fn seed() -> String {
    const DIGITS: usize = 16;
    let fraction = rand::random::<u64>() % 10_u64.pow(16);
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(fraction);
    let mut seed = String::with_capacity(3 + DIGITS);
    if rand::random::<bool>() {
        seed.push('-');
    }
    seed.push_str("0.");
    seed.extend(std::iter::repeat_n('0', DIGITS - digits.len()));
    seed.push_str(digits);
    seed
}

/// The end of a failed write's transaction and the session's reset, as one simple query:
/// `ROLLBACK` (a failed write keeps nothing), then [`RESET`] outside the transaction, in the
/// string's own implicit transaction, so its transactional parts are kept. A failure anywhere
/// in the string leaves the session unclean: it is closed, not pooled.
pub(crate) const ROLLBACK_AND_RESET: &str = concat!("ROLLBACK; ", reset_text!());

/// The settings this session took from role defaults at login (`ALTER ROLE ... SET`, for every
/// database or this one), by name; asked before the session sets anything over them.
const LOGIN_DEFAULTS: &str = "SELECT name::pg_catalog.text FROM pg_catalog.pg_settings \
WHERE source OPERATOR(pg_catalog.=) ANY (ARRAY['user', 'database user']::pg_catalog.text[])";

/// Why [`check_new`] refused a connection whose planted defaults it had removed: the next one
/// logs in without them.
const PLANTED_REMOVED: &str = "the client role's session defaults had been changed; removed";

/// Checks a connection that just logged in as the client role. With defaults the role did not
/// start with (a client's function ran `ALTER ROLE CURRENT_USER SET ...`, say a setting of a
/// library it loaded), the owner removes them and the connection is refused: it already runs
/// with them (`RESET ALL` returns to them), while the next one will not. When the owner cannot
/// remove them, the connection is kept: refusing every connection would stop the server, and
/// a client can plant only settings it may set in its own session. Returns why it was refused.
pub(crate) async fn check_new(client: &Client, keeper: &RoleKeeper) -> Result<(), String> {
    checked(client, keeper).await?;
    // What the check set goes, as after every request: the first one starts reset too.
    client
        .batch_execute(RESET)
        .await
        .map_err(|e| format!("cannot reset a new connection: {e}"))
}

async fn checked(client: &Client, keeper: &RoleKeeper) -> Result<(), String> {
    // The role defaults this very session logged in with, read before anything is SET over
    // them: the role's defaults now may already be clean (another connection's check removed
    // them) while this session still runs with them, and RESET ALL would return to them.
    let logged_in = client.query(LOGIN_DEFAULTS, &[]).await;
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
    let now = setup::role_settings(client, keeper.role())
        .await
        .map_err(|e| format!("cannot read the client role's defaults: {e}"))?;
    let planted = keeper.planted(&now);
    // Fail closed: a session whose login values cannot be read is not trusted.
    let unaccepted: Vec<String> = match &logged_in {
        Ok(rows) => rows
            .iter()
            .map(|row| row.get::<_, String>(0))
            .filter(|name| !keeper.accepts_default(name))
            .collect(),
        Err(e) => vec![format!("(unreadable: {e})")],
    };
    if planted.is_empty() {
        if unaccepted.is_empty() {
            return Ok(());
        }
        tracing::warn!(
            defaults = %unaccepted.join(", "),
            "a new connection logged in with client role defaults that were since removed: \
             refused it (the next one logs in without them)"
        );
        return Err(PLANTED_REMOVED.to_owned());
    }
    let names: Vec<&str> = planted.iter().map(setup::RoleSetting::name).collect();
    let names = names.join(", ");
    match keeper.remove(&planted).await {
        Ok(()) => {
            tracing::warn!(
                defaults = %names,
                "the client role's session defaults were changed (ALTER ROLE ... SET, by a \
                 client's function or an operator): removed them from the --database role's \
                 connection, and refused the connection that logged in with them"
            );
            Err(PLANTED_REMOVED.to_owned())
        }
        Err(why) => {
            // Another connection's check may have removed them at the same moment (PostgreSQL
            // answers one of two concurrent ALTER ROLEs "tuple concurrently updated"): then
            // this session is refused like any that logged in with them.
            let still = setup::role_settings(client, keeper.role())
                .await
                .map(|now| keeper.planted(&now));
            if still.is_ok_and(|left| left.is_empty()) {
                return Err(PLANTED_REMOVED.to_owned());
            }
            tracing::error!(
                defaults = %names,
                error = %why,
                "the client role has session defaults it did not start with, and the \
                 --database role cannot remove them: sessions run with them (a superuser can \
                 remove them: ALTER ROLE ... RESET ...)"
            );
            Ok(())
        }
    }
}

/// Whether getting a connection that failed with `err` is worth one more try: [`check_new`]
/// removed planted defaults (the next login is clean), or the login was refused for its
/// password and the owner put the server's back.
pub(crate) async fn worth_retrying(keeper: &RoleKeeper, err: &PoolError) -> bool {
    match err {
        PoolError::PostCreateHook(HookError::Message(why)) => why == PLANTED_REMOVED,
        PoolError::Backend(e) if e.code() == Some(&SqlState::INVALID_PASSWORD) => {
            keeper.restore_password().await
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reset_s_statements_are_the_reset() {
        assert_eq!(format!("{};", RESET_STATEMENTS.join("; ")), RESET);
    }

    #[test]
    fn a_seed_is_a_float8_strictly_between_minus_one_and_one() {
        let mut negative = 0;
        for _ in 0..2_000 {
            let seed = seed();
            let value: f64 = seed.parse().unwrap();
            assert!(value > -1.0 && value < 1.0, "{seed}");
            let digits = seed.trim_start_matches('-').strip_prefix("0.").unwrap();
            assert_eq!(digits.len(), 16, "{seed}");
            assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{seed}");
            negative += usize::from(value < 0.0);
        }
        // Either sign, about half the time each.
        assert!(
            (800..1_200).contains(&negative),
            "{negative} of 2,000 negative"
        );
    }
}
