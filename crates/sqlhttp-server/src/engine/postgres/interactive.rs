//! Interactive transactions on PostgreSQL: a [`Session`] holds one pooled connection (a
//! [`Lease`], with one of the engine's admission permits) from the transaction's open to its
//! end; at most all of the pool's connections but one are held so (the engine's transaction
//! slots), so plain requests always find one. The open is one message, as the server's own transactions are (ADR 0034): `BEGIN` with
//! the access, isolation and `DEFERRABLE` asked for, the statement timeout, a guard savepoint
//! with a random name, and the session and transaction it is (checked again at COMMIT, ADR
//! 0027).
//!
//! Each statement goes out behind its savepoint in one write (the previous statement's release
//! rides with it): a statement that fails is rolled back to it and the transaction goes on; a
//! serialization failure or a deadlock (SQLSTATE class `40`), or a connection lost, aborts the
//! transaction. The commit records the transaction's outcome through the store's
//! `_sqlhttp.record` inside the transaction, then commits, so a crash of either process leaves
//! it committed and recorded, or neither; a commit whose answer was lost is `Unknown`, for the
//! registry to read the record. A session dropped unended is discarded (its lease cancels and
//! ends the backend), which rolls it back.
//!
//! Knows SQL, tokio-postgres and the protocol's error codes; nothing about HTTP, tokens or the
//! registry (`crate::transactions`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};

use tokio::sync::OwnedSemaphorePermit;

use crate::engine::Access;
use crate::engine::interactive::{
    CommitError, Interactive, Isolation, Record, StepError, TxOptions, fenced,
};
use crate::engine::keyed::{Stored, now_millis};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::replicas::Route;
use crate::engine::postgres::transaction::{self, OPENED};
use crate::engine::postgres::{Inner, Job, STOP_WITHIN, exec, sandbox, session};
use crate::engine::stream::Sink;
use crate::protocol::bookmark::{Bookmark, Position, ServedBy};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;

/// Each statement's savepoint (clients cannot name savepoints: transaction control is refused).
const STEP: &str = "_sqlhttp_step";

/// One open PostgreSQL transaction on a held connection.
pub(crate) struct Session {
    inner: Arc<Inner>,
    /// `None` once the transaction is lost (the lease was dropped, which rolled it back).
    lease: Option<Lease>,
    read_only: bool,
    /// The last statement's savepoint is still to be released (with the next message).
    release_pending: bool,
    /// One of the connections transactions may hold (see `PostgresEngine::begin`).
    _slot: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("read_only", &self.read_only)
            .field("open", &self.lease.is_some())
            .finish_non_exhaustive()
    }
}

/// How far a statement's savepoint got (see `Session::step`).
#[derive(Default)]
struct Savepoint {
    /// Its message was written (it runs, whatever follows).
    sent: AtomicBool,
    /// PostgreSQL answered it: the statement can be undone to it.
    taken: AtomicBool,
}

/// Whether a PostgreSQL error ends the transaction: class `40` (serialization failure,
/// deadlock), or no answer at all (the connection is gone).
fn aborts(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => code.code().starts_with("40"),
        None => true,
    }
}

/// The answer for a statement a hot standby refuses for being one (see `replica_refuses`: an
/// `UNLOGGED` table, a function that needs a new OID or a transaction id, `lo_create`), in a
/// read-only transaction whose snapshot is the replica's. A plain read would go to the primary;
/// this statement cannot leave the transaction, and running it again here gets the same
/// refusal, so the answer is final (`403 STATEMENT_NOT_ALLOWED`, stored as the statement's; the
/// transaction goes on), never a `503` to retry.
fn refused_on_replica(e: &tokio_postgres::Error) -> ApiError {
    let said = e
        .as_db_error()
        .map(|db| super::errors::bounded(db.message()))
        .unwrap_or_default();
    ApiError::new(
        ErrorCode::StatementNotAllowed,
        format!(
            "this statement cannot run on a read replica (a hot standby refuses it: {said}), \
             and this read-only transaction is served by one: run it outside the transaction \
             (the primary serves it), or open the transaction with `Sqlhttp-Consistency: \
             primary`; the transaction goes on"
        ),
    )
}

/// The answer for a transaction whose statement the server's shutdown stopped: `503`, it was
/// rolled back.
fn stopped() -> ApiError {
    ApiError::unavailable(format!(
        "{} (the transaction's statement was cancelled and the transaction rolled back; \
         nothing of it was committed: run the whole transaction again)",
        crate::engine::SHUTTING_DOWN
    ))
}

/// The answer for a transaction PostgreSQL rolled back, with why.
fn aborted(why: &str) -> ApiError {
    ApiError::new(
        ErrorCode::TransactionAborted,
        format!(
            "the transaction cannot go on and was rolled back; nothing of it was committed: \
             {why}. Run the whole transaction again"
        ),
    )
}

impl Session {
    /// Leases a connection where `route` says and opens the transaction on it; on a replica,
    /// once it has replayed as far as the route asks (checked before the transaction's
    /// snapshot, see `transaction`). A read-only transaction with one snapshot (not `READ
    /// COMMITTED`) learns the snapshot's position at its open.
    pub(super) async fn open(
        route: Route,
        options: TxOptions,
        slot: OwnedSemaphorePermit,
    ) -> Result<Session, ApiError> {
        let job = Job::requiring(route.min());
        let inner = Arc::clone(route.node());
        let lease = inner.lease(&job).await?;
        let access = if options.read_only {
            "READ ONLY"
        } else {
            "READ WRITE"
        };
        let isolation = transaction::sql_level(options.isolation);
        let deferrable = if options.deferrable {
            ", DEFERRABLE"
        } else {
            ""
        };
        // `OPENED` takes the snapshot; the position read after it is at or past all it sees.
        let position = if options.read_only && options.isolation != Isolation::ReadCommitted {
            format!("; SELECT {}", inner.node.position_sql())
        } else {
            String::new()
        };
        let begin = format!(
            "BEGIN {access}, ISOLATION LEVEL {isolation}{deferrable}; \
             SET LOCAL statement_timeout = {}; SAVEPOINT {}; {OPENED}{position}",
            inner.timeout_ms(),
            lease.guard
        );
        transaction::open_with(&inner, &lease, &begin).await?;
        Ok(Session {
            inner,
            lease: Some(lease),
            read_only: options.read_only,
            release_pending: false,
            _slot: slot,
        })
    }

    /// Where the transaction's snapshot stands, when its open learned it.
    pub(crate) fn position(&self) -> Option<Position> {
        let lease = self.lease.as_ref()?;
        match lease.position.load(Ordering::Acquire) {
            0 => None,
            at => Some(Position {
                bookmark: Bookmark::from_position(at),
                served_by: if self.inner.node.is_replica() {
                    ServedBy::Replica
                } else {
                    ServedBy::Primary
                },
            }),
        }
    }

    /// Runs one statement inside its savepoint.
    pub(crate) async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        let inner = Arc::clone(&self.inner);
        // Registered before the flag is read: a shutdown that starts after wakes this.
        let stop = inner.stop_transactions.notified();
        let mut stop = std::pin::pin!(stop);
        stop.as_mut().enable();
        if inner.stopping_transactions.load(Ordering::Acquire) {
            self.lease = None;
            return Err(StepError::Aborted(stopped()));
        }
        let Some(lease) = self.lease.as_ref() else {
            return Err(StepError::Aborted(aborted("its connection was lost")));
        };
        if self.read_only {
            sandbox::check_read_only_text(&request.sql).map_err(StepError::Statement)?;
        }
        let ended = AtomicBool::new(false);
        let map = |e: tokio_postgres::Error| {
            if aborts(&e) {
                ended.store(true, Ordering::Release);
            }
            if inner.node.is_replica() && super::replica_refuses(&e) {
                return refused_on_replica(&e);
            }
            inner.map(&e)
        };
        let open_step = if self.release_pending {
            format!("RELEASE SAVEPOINT {STEP}; SAVEPOINT {STEP}")
        } else {
            format!("SAVEPOINT {STEP}")
        };
        let client = lease.client();
        let mut out = Vec::with_capacity(256);
        let mut sink = Sink::Buffered {
            limit: inner.limits.max_result_bytes,
        };
        // Whether this statement's savepoint message went out, and whether it was taken: a
        // statement refused before it (the text checks, a parameter count) has nothing to undo,
        // and undoing it would roll back to the *previous* statement's savepoint.
        let savepoint = Savepoint::default();
        let opening: exec::Opening<'_> = Box::pin(async {
            savepoint.sent.store(true, Ordering::Release);
            client.batch_execute(&open_step).await.map_err(&map)?;
            savepoint.taken.store(true, Ordering::Release);
            Ok(())
        });
        let job = Job::default();
        let ran = tokio::select! {
            ran = inner.guarded(
                &job,
                lease,
                1,
                exec::write_result(
                    lease,
                    &request,
                    &inner.limits,
                    &mut out,
                    &mut sink,
                    &map,
                    exec::Around {
                        before: Some(opening),
                        behind: None,
                    },
                ),
            ) => ran,
            () = &mut stop => {
                // The server is shutting down: the statement is not waited for. Dropping the
                // lease unended cancels it and ends its session (see `Lease`'s drop), which
                // rolls the transaction back.
                lease.cancel_statement().await;
                self.lease = None;
                return Err(StepError::Aborted(stopped()));
            }
        };
        match ran {
            Ok(()) => {
                self.release_pending = true;
                Ok(out)
            }
            Err(err) if ended.load(Ordering::Acquire) || client.is_closed() => {
                self.lease = None;
                Err(StepError::Aborted(aborted(&err.message)))
            }
            // Refused before anything was sent: the transaction is as it was, the previous
            // statement's savepoint still to be released.
            Err(err) if !savepoint.sent.load(Ordering::Acquire) => Err(StepError::Statement(err)),
            // The savepoint message itself failed: what it left (the previous savepoint
            // released, no new one) cannot be undone to a known point.
            Err(err) if !savepoint.taken.load(Ordering::Acquire) => {
                self.lease = None;
                Err(StepError::Aborted(aborted(&err.message)))
            }
            Err(err) => {
                self.release_pending = false;
                let undo = format!("ROLLBACK TO SAVEPOINT {STEP}; RELEASE SAVEPOINT {STEP}");
                match tokio::time::timeout(STOP_WITHIN, client.batch_execute(&undo)).await {
                    Ok(Ok(())) => Err(StepError::Statement(err)),
                    _ => {
                        self.lease = None;
                        Err(StepError::Aborted(aborted(&err.message)))
                    }
                }
            }
        }
    }

    /// Checks that the transaction is still the one the server opened, stores `record` in it,
    /// and commits; a read-only transaction ends with ROLLBACK (it wrote nothing). The session
    /// is reset and pooled again.
    pub(crate) async fn commit(
        mut self,
        record: Option<Record>,
    ) -> Result<Option<Bookmark>, CommitError> {
        let Some(mut lease) = self.lease.take() else {
            return Err(CommitError::RolledBack(aborted("its connection was lost")));
        };
        let inner = Arc::clone(&self.inner);
        if self.read_only {
            return end(&inner, lease, "ROLLBACK")
                .await
                .map(|()| None)
                .map_err(CommitError::RolledBack);
        }
        let Some(opened) = lease
            .opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return Err(CommitError::RolledBack(ApiError::internal()));
        };
        let within = inner.limits.statement_timeout.saturating_add(STOP_WITHIN);
        let client = lease.client();
        let prologue = format!(
            "SET LOCAL statement_timeout = {}; SET CONSTRAINTS ALL IMMEDIATE; \
             RELEASE SAVEPOINT {}; SELECT _sqlhttp.check_transaction('{}'::pg_catalog.numeric)",
            inner.timeout_ms(),
            lease.guard,
            opened.at
        );
        // The record is claimed, not overwritten: another server that answered for this
        // transaction first ("nothing committed", its holder taken for gone) left a tombstone
        // under its key, and this COMMIT must not make that answer false. Whichever claim comes
        // second waits for the first's transaction on the key's row, then sees it.
        let checked = async {
            client.batch_execute(&prologue).await?;
            if let Some(record) = &record {
                let hash = &record.request_hash[..];
                let claimed = client
                    .query_one(
                        "SELECT request_hash FROM _sqlhttp.claim($1, $2, $3, $4, $5, $6)",
                        &[
                            &inner.store_key,
                            &record.key,
                            &hash,
                            &200_i32,
                            &record.body,
                            &now_millis(),
                        ],
                    )
                    .await?;
                return Ok(claimed.get::<_, &[u8]>(0) == hash);
            }
            Ok::<bool, tokio_postgres::Error>(true)
        };
        match tokio::time::timeout(within, checked).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                return match end(&inner, lease, "ROLLBACK").await {
                    Ok(()) | Err(_) => Err(CommitError::RolledBack(fenced())),
                };
            }
            Ok(Err(e)) => {
                let err = if aborts(&e) {
                    aborted(&inner.map(&e).message)
                } else if e.code().is_some_and(|c| c.code() == "SQLHT") {
                    ApiError::bad_request(
                        "the transaction's statements ended or replaced it: it was rolled back \
                         and nothing was kept",
                    )
                } else {
                    inner.map(&e)
                };
                // Nothing committed: end it and pool the session again when it is clean.
                if client.is_closed() {
                    return Err(CommitError::RolledBack(err));
                }
                return match end(&inner, lease, "ROLLBACK").await {
                    Ok(()) | Err(_) => Err(CommitError::RolledBack(err)),
                };
            }
            // The lease is dropped unclean: its backend is ended, which rolls back.
            Err(_) => {
                return Err(CommitError::RolledBack(ApiError::new(
                    ErrorCode::StatementTimeout,
                    "the transaction's deferred work ran past this server's statement timeout; \
                     it was rolled back and nothing was kept",
                )));
            }
        }
        // The position read after COMMIT is at or past its record (see `transaction`); a
        // message of its own, so that its failure never reads as the COMMIT's.
        let ending = async {
            tokio::join!(
                client.simple_query("COMMIT"),
                client.simple_query(transaction::POSITION_AFTER_COMMIT),
                client.batch_execute(session::RESET)
            )
        };
        let Ok((committed, position, reset)) = tokio::time::timeout(within, ending).await else {
            return Err(CommitError::Unknown(ApiError::outcome_unknown(
                "the database did not answer the COMMIT in time: whether the transaction \
                 committed is not known yet; send the COMMIT again",
            )));
        };
        match committed {
            Ok(_) => {
                if let Err(e) = reset {
                    tracing::warn!(error = %e, "cannot reset a session; closing it");
                    lease.retire();
                }
                lease.clean = true;
                let position = position
                    .ok()
                    .and_then(|answer| transaction::first_position(&answer));
                if position.is_none() {
                    tracing::warn!("a transaction's position after its COMMIT was not read");
                }
                Ok(position)
            }
            Err(e) if e.code().is_none() => Err(CommitError::Unknown(ApiError::outcome_unknown(
                "the connection to the database was lost during COMMIT: whether the \
                 transaction committed is not known yet; send the COMMIT again",
            ))),
            Err(e) if aborts(&e) => Err(CommitError::RolledBack(aborted(&inner.map(&e).message))),
            Err(e) => Err(CommitError::RolledBack(inner.map(&e))),
        }
    }

    /// Rolls back; the session is reset and pooled again.
    pub(crate) async fn rollback(mut self) {
        if let Some(lease) = self.lease.take() {
            let _ = end(&self.inner, lease, "ROLLBACK").await;
        }
    }
}

/// Ends the transaction on `lease` with `end` and resets the session, pooling it again when
/// both went well (else it is discarded, which ends whatever is left).
async fn end(inner: &Inner, mut lease: Lease, end: &str) -> Result<(), ApiError> {
    let client = lease.client();
    let ended = tokio::time::timeout(STOP_WITHIN, async {
        tokio::join!(
            client.batch_execute(end),
            client.batch_execute(session::RESET)
        )
    })
    .await;
    match ended {
        Ok((Ok(()), Ok(()))) => {
            lease.clean = true;
            Ok(())
        }
        Ok((Ok(()), Err(e))) => {
            tracing::warn!(error = %e, "cannot reset a session; closing it");
            lease.retire();
            lease.clean = true;
            Ok(())
        }
        Ok((Err(e), _)) => Err(inner.map(&e)),
        Err(_) => Err(ApiError::interrupted()),
    }
}

/// The engine contract's calls, answered by the inherent ones above.
impl Interactive for Session {
    fn position(&self) -> Option<Position> {
        Session::position(self)
    }

    async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        Session::step(self, request).await
    }

    async fn commit(self, record: Option<Record>) -> Result<Option<Bookmark>, CommitError> {
        Session::commit(self, record).await
    }

    async fn rollback(self) {
        Session::rollback(self).await;
    }
}

/// Stores a `200` with `body` under `key` in the server's store, in a transaction of its own.
pub(super) async fn store_record(
    inner: &Inner,
    job: &Job,
    key: &str,
    request_hash: &[u8; 32],
    body: &[u8],
) -> Result<(), ApiError> {
    let lease = inner.lease(job).await?;
    if let Err(err) = transaction::begin_store(inner, &lease, Access::ReadWrite).await {
        return transaction::end(inner, lease, Access::ReadWrite, Err(err)).await;
    }
    let hash = &request_hash[..];
    let stored = lease
        .client()
        .execute(
            "SELECT _sqlhttp.record($1, $2, $3, $4, $5, $6)",
            &[
                &inner.store_key,
                &key,
                &hash,
                &200_i32,
                &body,
                &now_millis(),
            ],
        )
        .await
        .map(drop)
        .map_err(|e| inner.map(&e));
    transaction::end(inner, lease, Access::ReadWrite, stored).await
}

/// Claims `key` in the server's store with a record, in a transaction of its own (see
/// `_sqlhttp.claim`): what is stored under it then.
pub(super) async fn claim_record(
    inner: &Inner,
    job: &Job,
    key: &str,
    request_hash: &[u8; 32],
    status: u16,
    body: &[u8],
) -> Result<Stored, ApiError> {
    let lease = inner.lease(job).await?;
    if let Err(err) = transaction::begin_store(inner, &lease, Access::ReadWrite).await {
        return transaction::end(inner, lease, Access::ReadWrite, Err(err)).await;
    }
    let hash = &request_hash[..];
    let claimed = lease
        .client()
        .query_one(
            &format!(
                "SELECT request_hash, status, body, created_at, {} \
                 FROM _sqlhttp.claim($1, $2, $3, $4, $5, $6)",
                transaction::COMMITTED_AT
            ),
            &[
                &inner.store_key,
                &key,
                &hash,
                &i32::from(status),
                &body,
                &now_millis(),
            ],
        )
        .await
        .map(|row| Stored {
            request_hash: row.get(0),
            status: u16::try_from(row.get::<_, i32>(1)).unwrap_or(500),
            body: row.get(2),
            created_at: row.get(3),
            position: row
                .get::<_, Option<&str>>(4)
                .and_then(crate::protocol::bookmark::from_lsn),
        })
        .map_err(|e| inner.map(&e));
    transaction::end(inner, lease, Access::ReadWrite, claimed).await
}

/// The outcome stored under `key` in the server's store, read in a read-only transaction.
pub(super) async fn recorded(
    inner: &Inner,
    job: &Job,
    key: &str,
) -> Result<Option<Stored>, ApiError> {
    let lease = inner.lease(job).await?;
    if let Err(err) = transaction::begin_store(inner, &lease, Access::ReadOnly).await {
        return transaction::end(inner, lease, Access::ReadOnly, Err(err)).await;
    }
    let found = lease
        .client()
        .query_opt(
            &format!(
                "SELECT request_hash, status, body, created_at, {} \
                 FROM _sqlhttp.lookup($1, $2)",
                transaction::COMMITTED_AT
            ),
            &[&inner.store_key, &key],
        )
        .await
        .map(|row| {
            // The position is read once the lookup saw the record: at or past the commit
            // that stored it.
            row.map(|row| Stored {
                request_hash: row.get(0),
                status: u16::try_from(row.get::<_, i32>(1)).unwrap_or(500),
                body: row.get(2),
                created_at: row.get(3),
                position: row
                    .get::<_, Option<&str>>(4)
                    .and_then(crate::protocol::bookmark::from_lsn),
            })
        })
        .map_err(|e| inner.map(&e));
    transaction::end(inner, lease, Access::ReadOnly, found).await
}
