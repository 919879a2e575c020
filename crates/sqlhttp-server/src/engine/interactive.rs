//! Interactive transactions, what the engine contract says of them: the options a transaction
//! opens with ([`TxOptions`], [`Isolation`]), what an engine's open transaction answers
//! ([`Interactive`], implemented by each engine's session and dispatched by
//! `engine::session::Session`, as `Backend` dispatches [`Engine`](crate::engine::Engine)), how a
//! statement in it fails ([`StepError`]: the statement alone, or the whole transaction) and how a
//! commit fails ([`CommitError`]), and the outcome record a commit stores with its effects
//! ([`Record`]).
//!
//! The engines import this file; it imports none of them (the dispatching enum, which must name
//! each engine's session, lives apart in `engine/session.rs`, so no import runs in a circle).
//! Which transaction a request names, its sequence of statements, its bounds and its finished
//! outcomes are the transaction layer's (`crate::transactions`). Knows the protocol's error
//! codes; nothing about HTTP, tokens or either engine's SQL.

use crate::protocol::bookmark::{Bookmark, Position};

use crate::engine::Access;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
pub(crate) use crate::protocol::transaction::Isolation;

/// How a transaction opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct TxOptions {
    /// Only statements that cannot write run in it.
    pub(crate) read_only: bool,
    /// Its isolation level.
    pub(crate) isolation: Isolation,
    /// A read-only serializable transaction that waits for a snapshot that cannot fail
    /// (PostgreSQL's `DEFERRABLE`; every SQLite read transaction is one).
    pub(crate) deferrable: bool,
}

impl TxOptions {
    /// What its statements may do.
    pub(crate) fn access(self) -> Access {
        if self.read_only {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        }
    }

    /// Refuses options no engine can honour: `deferrable` is for read-only serializable
    /// transactions only.
    pub(crate) fn check(self) -> Result<TxOptions, ApiError> {
        if self.deferrable && !(self.read_only && self.isolation == Isolation::Serializable) {
            return Err(ApiError::bad_request(
                "`deferrable` is for a read-only serializable transaction only",
            ));
        }
        Ok(self)
    }
}

/// How a statement in a transaction failed.
#[derive(Debug)]
pub(crate) enum StepError {
    /// The statement failed and was undone; the transaction goes on as it was before it.
    Statement(ApiError),
    /// The transaction cannot go on (a serialization failure, a deadlock, a statement that
    /// ended it, its connection lost): it was rolled back.
    Aborted(ApiError),
}

/// How a commit failed.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// It did not commit: rolled back, with why (a deferred constraint, a serialization
    /// failure, ...).
    RolledBack(ApiError),
    /// Whether it committed is not known (the database connection was lost during COMMIT):
    /// the outcome record tells, once the database answers again.
    Unknown(ApiError),
}

/// What a commit stores with its effects, in the engine's idempotency store: under `key`, a
/// `200` with `body`, identified by `request_hash`.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) key: String,
    pub(crate) request_hash: [u8; 32],
    pub(crate) body: Vec<u8>,
}

/// An engine's open transaction: one connection held across requests. Each engine's session
/// implements it (`sqlite::interactive::Session`, `postgres::interactive::Session`), and
/// [`Session`](crate::engine::Session) dispatches to whichever the configured engine opened,
/// as [`Backend`](crate::engine::Backend) does for [`Engine`](crate::engine::Engine).
pub(crate) trait Interactive: Sized + Send + std::fmt::Debug {
    /// Where the transaction's snapshot stands, when the engine learned it at the open (a
    /// read-only `REPEATABLE READ` one on PostgreSQL: every statement of it sees that
    /// snapshot). None by default: an engine without log positions (SQLite).
    fn position(&self) -> Option<Position> {
        None
    }

    /// Whether the engine ended the transaction on its own (rolled back: on SQLite, a write
    /// transaction idle past `--transaction-write-idle`, a read-only one pinning an overgrown
    /// write-ahead log; ADR 0042): the registry then answers it as expired. Never, by default.
    fn must_end(&self) -> bool {
        false
    }

    /// Runs one statement in the transaction.
    async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError>;

    /// Commits, with `record` stored in the same transaction; the position after the commit
    /// when the engine has one (see `protocol::bookmark`).
    async fn commit(self, record: Option<Record>) -> Result<Option<Bookmark>, CommitError>;

    /// Rolls back.
    async fn rollback(self);
}

/// A boxed session answers as the one it holds (PostgreSQL's is boxed in the dispatching enum:
/// it is far larger than SQLite's).
impl<S: Interactive> Interactive for Box<S> {
    fn position(&self) -> Option<Position> {
        S::position(self)
    }

    fn must_end(&self) -> bool {
        S::must_end(self)
    }

    async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        S::step(self, request).await
    }

    async fn commit(self, record: Option<Record>) -> Result<Option<Bookmark>, CommitError> {
        S::commit(*self, record).await
    }

    async fn rollback(self) {
        S::rollback(*self).await;
    }
}

/// The answer for a COMMIT that found another server's tombstone under its record's key: that
/// server answered for the transaction first, "nothing committed" (its holder taken for gone),
/// and that answer stays true.
pub(crate) fn fenced() -> ApiError {
    ApiError::new(
        ErrorCode::TransactionExpired,
        "another server answered for this transaction first (this one was taken for gone) and \
         said nothing of it was committed: it was rolled back, and nothing of it was committed",
    )
}

/// The error for an isolation level SQLite does not have: its transactions are serializable.
pub(crate) fn sqlite_serializable_only(isolation: Isolation) -> Result<(), ApiError> {
    if isolation == Isolation::Serializable {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::BadRequest,
        format!(
            "this server's database is SQLite, whose transactions are serializable only: \
             `isolation` `{}` is not offered (leave it out, or ask for `serializable`)",
            isolation.as_str()
        ),
    ))
}
