//! The server's transaction around each PostgreSQL request: [`begin`] opens it in one
//! message (its access, its statement timeout, the guard savepoint, the session and transaction
//! it is), and [`end`] ends it, checking in COMMIT's own message that the transaction
//! committing is the one the server opened, and resets the session in the same round trip (ADR
//! 0027, ADR 0034). Reads end with ROLLBACK.
//!
//! Each also learns where the request stands (ADR 0039): a read's `BEGIN` message reads the log
//! position once its snapshot is taken (an upper bound of everything it sees at `REPEATABLE
//! READ`; a batch at `READ COMMITTED` reads it again after its last statement), on a replica
//! after checking, before the snapshot, that the replica has replayed as far as the request's
//! bookmark asks; a write's COMMIT message reads it once the commit is in the log.
//!
//! Knows SQL and the protocol's error codes; nothing about what ran inside or about HTTP.

use std::future::Future;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;

use crate::engine::Access;
use crate::engine::interactive::Isolation;
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::{Inner, STOP_WITHIN, exec, session};
use crate::protocol::bookmark::Bookmark;
use crate::protocol::error::ApiError;

/// What [`begin`] saw of the transaction it opened, checked again before COMMIT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Opened {
    /// `transaction_timestamp()` as seconds since the epoch (PostgreSQL's `numeric` text,
    /// exact to the microsecond): a transaction a client's statements began after ending the
    /// server's has another. Checked by `_sqlhttp.check_transaction` in the COMMIT's message.
    pub(super) at: String,
}

impl Opened {
    /// The transaction's start as BEGIN's message read it, `None` (logged) when it is not a
    /// number: the text goes back into the COMMIT's message as a literal, digits and a point
    /// only.
    pub(super) fn checked(at: String) -> Option<Opened> {
        if at.is_empty() || !at.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            tracing::error!(at, "BEGIN's transaction start is not a number");
            return None;
        }
        Some(Opened { at })
    }
}

/// Opens the server's transaction on `lease` (its mode and statement timeout), in one
/// message: `BEGIN` first, so a failure anywhere in it leaves no statement of the message
/// run outside the transaction. The session was reset when its last request ended (see
/// [`end`]) or when it logged in (`session::check_new`). A write opens the guard
/// savepoint, released just before COMMIT; a read ends with ROLLBACK, which cannot keep
/// anything, and needs neither the guard nor the check of [`Opened`].
pub(super) async fn begin(inner: &Inner, lease: &Lease, mode: Access) -> Result<(), ApiError> {
    begin_at(inner, lease, mode, None).await
}

/// [`begin`] at `isolation`; `None` is the request's default: `REPEATABLE READ` for
/// a read (one snapshot for all its statements), `READ COMMITTED` for a write.
pub(super) async fn begin_at(
    inner: &Inner,
    lease: &Lease,
    mode: Access,
    isolation: Option<Isolation>,
) -> Result<(), ApiError> {
    begin_waiting(inner, lease, mode, isolation, inner.lock_wait_ms()).await
}

/// [`begin_at`] for a batch: a write batch waits for locks as long as its statement
/// timeout allows, not [`LOCK_WAIT`](super::LOCK_WAIT): batches carry schema changes and
/// migrations (ADR 0031), whose lock waits are expected (a migration re-applied after its
/// server died waits for the dead session's locks to go), and a failure of one costs its
/// client the whole batch (ADR 0043). A read batch waits as a read does.
pub(super) async fn begin_batch(
    inner: &Inner,
    lease: &Lease,
    mode: Access,
    isolation: Option<Isolation>,
) -> Result<(), ApiError> {
    let lock_wait_ms = match mode {
        Access::ReadOnly => inner.lock_wait_ms(),
        Access::ReadWrite => 0,
    };
    begin_waiting(inner, lease, mode, isolation, lock_wait_ms).await
}

/// [`begin`] for the server's own store (a commit record's claim, a lookup): its
/// waits on a key's row are by design (a tombstone's claim waits for a COMMIT that holds
/// the row, ADR 0041), so they are bounded by the statement timeout only, not by
/// `lock_timeout` as a client's request is (ADR 0043).
pub(super) async fn begin_store(
    inner: &Inner,
    lease: &Lease,
    mode: Access,
) -> Result<(), ApiError> {
    begin_waiting(inner, lease, mode, None, 0).await
}

/// [`begin_at`], waiting at most `lock_wait_ms` for a lock (0: no limit but the
/// statement timeout).
async fn begin_waiting(
    inner: &Inner,
    lease: &Lease,
    mode: Access,
    isolation: Option<Isolation>,
    lock_wait_ms: u128,
) -> Result<(), ApiError> {
    let client = lease.client();
    let level = |default: &'static str| isolation.map_or(default, sql_level);
    match mode {
        // A read ends with ROLLBACK, whatever it began. The position is read by the first
        // statement that takes a snapshot, after taking it: in `REPEATABLE READ` (a read's
        // default) that snapshot is the one every statement of the read sees.
        Access::ReadOnly => {
            let begin = format!(
                "BEGIN READ ONLY, ISOLATION LEVEL {}; SET LOCAL statement_timeout = {}; \
                 SET LOCAL lock_timeout = {}; SELECT {}",
                level("REPEATABLE READ"),
                inner.timeout_ms(),
                lock_wait_ms,
                inner.node.position_sql()
            );
            let begun = replayed_before(inner, lease, client.simple_query(&begin)).await?;
            learn_position(inner, lease, begun)
        }
        Access::ReadWrite => {
            let begin = format!(
                "BEGIN READ WRITE, ISOLATION LEVEL {}; \
                 SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}; \
                 SAVEPOINT {}; {OPENED}",
                level("READ COMMITTED"),
                inner.timeout_ms(),
                lock_wait_ms,
                lease.guard
            );
            open_with(inner, lease, &begin).await
        }
    }
}

/// Runs `opening` (a read's `BEGIN` message, written at its first poll); on a replica, first
/// asks how far it has replayed, in a transaction of its own written just before, so a
/// snapshot the opening takes sees at least that: short of the request's bookmark
/// (`Lease::min`), the read is refused `503` (served elsewhere, see `PostgresEngine::read`).
pub(super) async fn replayed_before<T>(
    inner: &Inner,
    lease: &Lease,
    opening: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<Result<T, tokio_postgres::Error>, ApiError> {
    if !inner.node.is_replica() {
        return Ok(opening.await);
    }
    let (replayed, opened) = tokio::join!(lease.client().simple_query(REPLAYED), opening);
    let replayed = replayed.map_err(|e| inner.map(&e))?;
    if first_position(&replayed).unwrap_or_default().position() < lease.min {
        return Err(behind());
    }
    Ok(opened)
}

/// Keeps the position a message's answer names (its first row's first cell, a `pg_lsn`'s
/// text) as the request's, when it is further than what the request saw so far.
pub(super) fn learn_position(
    inner: &Inner,
    lease: &Lease,
    answer: Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>,
) -> Result<(), ApiError> {
    let answer = answer.map_err(|e| inner.map(&e))?;
    match first_position(&answer) {
        Some(position) => {
            lease
                .position
                .fetch_max(position.position(), Ordering::AcqRel);
            Ok(())
        }
        None => {
            tracing::error!("the database did not name its log position");
            Err(ApiError::internal())
        }
    }
}

/// Runs `begin`, a write's `BEGIN` message that ends with [`OPENED`], and keeps the
/// transaction's start it read, for the check in COMMIT's message (see [`Opened`]).
/// A message that selects the log position after it (a read-only transaction's open)
/// keeps that too, from its last row (see [`learn_position`]).
pub(super) async fn open_with(inner: &Inner, lease: &Lease, begin: &str) -> Result<(), ApiError> {
    let answer = replayed_before(inner, lease, lease.client().simple_query(begin))
        .await?
        .map_err(|e| inner.map(&e))?;
    let rows: Vec<&tokio_postgres::SimpleQueryRow> = answer
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .collect();
    if let [_, .., last] = rows.as_slice()
        && let Some(position) = last.get(0).and_then(crate::protocol::bookmark::from_lsn)
    {
        lease
            .position
            .fetch_max(position.position(), Ordering::AcqRel);
    }
    let at = answer.iter().find_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    });
    let Some(at) = at else {
        tracing::error!("BEGIN's answer did not name the transaction");
        return Err(ApiError::internal());
    };
    let Some(opened) = Opened::checked(at) else {
        return Err(ApiError::internal());
    };
    *lease.opened.lock().unwrap_or_else(PoisonError::into_inner) = Some(opened);
    Ok(())
}

/// Ends the transaction: a write that succeeded commits (with the statement timeout set
/// again, which a client's function may have lowered, for the work COMMIT runs: deferred
/// triggers, cursors held past it), after checking in the same message that the
/// transaction is still the one [`begin`] opened (the guard savepoint's release,
/// and `_sqlhttp.check_transaction`: a client's statements may have ended it and begun
/// another, `;COMMIT; BEGIN` had the text checks missed them, which must not commit in its
/// place: ADR 0027). Anything else rolls back: a failure, and every read (it wrote
/// nothing; a ROLLBACK cannot keep a replaced transaction either). The session's reset
/// ([`session::RESET`]) goes in the same round trip, after the transaction ended, so the
/// session goes back to the pool clean. The lease goes back to the pool unless the
/// connection is in doubt; past `--statement-timeout` and [`STOP_WITHIN`], the end is
/// abandoned and the connection discarded (its transaction rolls back).
pub(super) async fn end<T>(
    inner: &Inner,
    lease: Lease,
    mode: Access,
    result: Result<T, ApiError>,
) -> Result<T, ApiError> {
    let client = lease.client();
    let commits = result.is_ok() && mode == Access::ReadWrite;
    let opened = lease
        .opened
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let ending = async {
        if !commits {
            // The reset runs once the transaction ended, in the same message.
            let end = match mode {
                Access::ReadOnly => session::after_read(),
                Access::ReadWrite => session::ROLLBACK_AND_RESET.to_owned(),
            };
            return client.batch_execute(&end).await.map_err(Ending::Reset);
        }
        let Some(opened) = &opened else {
            return Err(Ending::Tampered(tampered()));
        };
        // Deferred constraints and triggers run here, under the timeout; session advisory
        // locks a client took end with its request (the reset's unlock). The position read
        // after COMMIT is at or past the commit's record: a replica that replayed that far
        // shows the write.
        let end = commit_message(inner, &lease.guard, opened);
        // One write: the position and the reset run once the transaction ended, whatever
        // its end did (a failure abandons the rest of COMMIT's message, so each is a message
        // of its own). The position's failure after a COMMIT that was kept leaves the write
        // without its bookmark, never answered as failed.
        let (ended, position, reset) = tokio::join!(
            client.simple_query(&end),
            client.simple_query(POSITION_AFTER_COMMIT),
            client.batch_execute(session::RESET)
        );
        let ended = ended.map(|_| match position.as_deref().map(first_position) {
            Ok(Some(position)) => {
                lease
                    .position
                    .fetch_max(position.position(), Ordering::AcqRel);
            }
            Ok(None) | Err(_) => {
                tracing::warn!("a write's position after its COMMIT was not read");
            }
        });
        match ended {
            Err(e) => {
                // Whatever transaction the session is in now is not to be kept.
                let _ = client.batch_execute("ROLLBACK").await;
                if e.code()
                    .is_some_and(|code| code.code() == TAMPERED_SQLSTATE)
                {
                    return Err(Ending::Tampered(tampered()));
                }
                Err(Ending::Postgres(e))
            }
            // Ended as asked, but the session is not clean: not pooled again.
            Ok(()) => reset.map_err(Ending::Reset),
        }
    };
    let answered = tokio::time::timeout(end_within(inner, result.is_ok()), ending)
        .await
        .ok();
    ended(inner, lease, mode, result, SentEnd(answered))
}

/// The simple query that commits a write whose statements succeeded, checking first that
/// its transaction is the one opened with `guard` at `opened` (see [`end`]). Its
/// statement timeout is set for the session, not the transaction, so it outlives the
/// COMMIT: [`POSITION_AFTER_COMMIT`], sent after it as a query of its own, then runs under
/// the server's timeout (a client's function may have set one of a millisecond for the
/// session; the reset after both undoes the setting). A simple query: no statement a
/// client's function prepared can stand in for any of its parts.
pub(super) fn commit_message(inner: &Inner, guard: &str, opened: &Opened) -> String {
    format!(
        "SET statement_timeout = {}; SET CONSTRAINTS ALL IMMEDIATE; \
         RELEASE SAVEPOINT {guard}; \
         SELECT _sqlhttp.check_transaction('{}'::pg_catalog.numeric); COMMIT",
        inner.timeout_ms(),
        opened.at
    )
}

/// Waits for a read's end that was written behind its statement
/// (`session::after_read`, see `exec::Behind`) as [`end`] waits for its own,
/// for [`ended`]; `None` when there was none.
pub(super) async fn sent_end(
    inner: &Inner,
    statement_ok: bool,
    behind: Option<exec::Behind<'_>>,
) -> Option<SentEnd> {
    let behind = behind?;
    if !statement_ok && inner.node.is_gone() {
        // Not waited for: the session is discarded (its transaction ends with it).
        return Some(SentEnd(None));
    }
    let ended = tokio::time::timeout(end_within(inner, statement_ok), behind.answer())
        .await
        .ok();
    Some(SentEnd(ended.map(|answer| answer.map_err(Ending::Reset))))
}

/// [`ended`] when the end was `sent` behind the statement, else [`end`].
pub(super) async fn end_or_ended<T>(
    inner: &Inner,
    lease: Lease,
    mode: Access,
    result: Result<T, ApiError>,
    sent: Option<SentEnd>,
) -> Result<T, ApiError> {
    match sent {
        Some(sent) => ended(inner, lease, mode, result, sent),
        None => end(inner, lease, mode, result).await,
    }
}

/// How long an end may take: a rollback is quick unless the session is stuck in work that
/// ignores cancels (then it is not waited for, and the session is ended, which rolls back);
/// a COMMIT runs deferred work under the statement timeout.
pub(super) fn end_within(inner: &Inner, statement_ok: bool) -> Duration {
    if statement_ok {
        inner.limits.statement_timeout.saturating_add(STOP_WITHIN)
    } else {
        STOP_WITHIN
    }
}

/// What a request whose transaction ended as `sent` says, and where its lease goes: back
/// to the pool when the end and the reset went as asked, closed when only the reset failed,
/// discarded (its session ended) when the end was abandoned or failed.
pub(super) fn ended<T>(
    inner: &Inner,
    mut lease: Lease,
    mode: Access,
    result: Result<T, ApiError>,
    sent: SentEnd,
) -> Result<T, ApiError> {
    let Some(ended) = sent.0 else {
        // A read has nothing to keep: its rows are its answer whichever way it ended.
        if result.is_err() || mode == Access::ReadOnly {
            return result;
        }
        // Dropping the unclean lease cancels the statement and ends the session. COMMIT may
        // have completed meanwhile: the outcome is not known, and the answer says so (a
        // keyed retry replays it, or runs it if it was not kept).
        return Err(ApiError::outcome_unknown(format!(
            "the transaction did not finish ending within this server's limit of {} ms \
             (--statement-timeout); whether it was kept is unknown: retry with the same \
             Idempotency-Key, or check",
            inner.timeout_ms()
        )));
    };
    match ended {
        Ok(()) => {
            lease.clean = true;
            result
        }
        Err(Ending::Reset(e)) => {
            // The transaction ended as asked (or, for a rollback, could not have kept
            // anything); the session is closed, not pooled.
            tracing::warn!(error = %e, "cannot end or reset a session; closing it");
            lease.retire();
            lease.clean = true;
            result
        }
        // The statement's own error explains more than the failed end.
        Err(_) if result.is_err() => result,
        // The session is not reused (the lease is unclean): its state is the client's.
        Err(Ending::Tampered(err)) => Err(err),
        // The connection went during COMMIT's message: it may have committed.
        Err(Ending::Postgres(e)) if e.code().is_none() => Err(ApiError::outcome_unknown(
            "the connection to the database was lost while the transaction committed; \
             whether it was kept is unknown: retry with the same Idempotency-Key, or check",
        )),
        Err(Ending::Postgres(e)) => Err(inner.map(&e)),
    }
}

/// How a transaction's end went: `None` when it did not answer in time (see
/// [`ended`]).
pub(super) struct SentEnd(Option<Result<(), Ending>>);

/// PostgreSQL's name for `isolation`.
pub(super) fn sql_level(isolation: Isolation) -> &'static str {
    match isolation {
        Isolation::Serializable => "SERIALIZABLE",
        Isolation::RepeatableRead => "REPEATABLE READ",
        Isolation::ReadCommitted => "READ COMMITTED",
    }
}

/// Why a transaction did not end as asked.
#[derive(Debug)]
pub(super) enum Ending {
    Postgres(tokio_postgres::Error),
    /// It was not the server's transaction any more (see [`end`]).
    Tampered(ApiError),
    /// The transaction ended as asked, but the session's reset after it failed; or a
    /// rollback and the reset in one message failed (a rollback keeps nothing either way).
    Reset(tokio_postgres::Error),
}

/// The text of [`COMMITTED_AT`], for the consts built from it.
macro_rules! committed_at {
    () => {
        "pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text"
    };
}

/// The log position after a commit: its record's end or later (`pg_lsn` text).
pub(super) const COMMITTED_AT: &str = committed_at!();

/// The query that reads the log position once a COMMIT ended, sent as a message of its own
/// behind the COMMIT's: at or past the commit's record.
pub(super) const POSITION_AFTER_COMMIT: &str = concat!("SELECT ", committed_at!());

/// How far a replica has replayed the primary's log (`pg_lsn` text), asked before a read's
/// snapshot.
const REPLAYED: &str = "SELECT pg_catalog.pg_last_wal_replay_lsn()::pg_catalog.text";

/// The first cell of the first row of a simple query's answer, as a log position.
pub(super) fn first_position(answer: &[SimpleQueryMessage]) -> Option<Bookmark> {
    answer.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => row.get(0).and_then(crate::protocol::bookmark::from_lsn),
        _ => None,
    })
}

/// The answer of a replica that has not replayed as far as the request's bookmark asks: the
/// engine serves the read elsewhere (see `replicas`).
fn behind() -> ApiError {
    ApiError::unavailable(
        "the read replica has not replayed as far as the request's bookmark; retry",
    )
    .elsewhere()
}

/// What a write's `BEGIN` message reads last: the transaction's start (see [`Opened`]).
pub(super) const OPENED: &str =
    "SELECT EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text";

/// The SQLSTATE `_sqlhttp.check_transaction` raises (see `setup`) for a transaction that is
/// not the one the server opened.
pub(super) const TAMPERED_SQLSTATE: &str = "SQLHT";

/// The answer for a request whose statements ended or replaced the server's transaction.
pub(super) fn tampered() -> ApiError {
    tracing::warn!("a request ended or changed the server's transaction; rolled back");
    ApiError::bad_request(format!(
        "the request's statements ended or replaced the server's transaction: it was rolled \
         back and nothing was kept. {}",
        crate::engine::sandbox::TRANSACTION_HINT
    ))
}
