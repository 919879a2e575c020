//! Interactive transactions, what the engine contract says of them: the options a transaction
//! opens with ([`TxOptions`], [`Isolation`]), an engine's open transaction ([`Session`], one
//! per engine, dispatched here), how a statement in it fails ([`StepError`]: the statement
//! alone, or the whole transaction) and how a commit fails ([`CommitError`]), and the outcome
//! record a commit stores with its effects ([`Record`]).
//!
//! Which transaction a request names, its sequence of statements, its bounds and its finished
//! outcomes are the registry's (`engine::transactions`). Knows the protocol's error codes;
//! nothing about HTTP, tokens or either engine's SQL.

use crate::protocol::bookmark::{Bookmark, Position};

use crate::engine::Access;
#[cfg(feature = "postgres")]
use crate::engine::postgres::interactive as postgres;
use crate::engine::sqlite::interactive as sqlite;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;

/// A transaction's isolation level, as the client asks for it: the protocol's (ADR 0048).
pub(crate) use sqlhttp_protocol::Isolation;

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

/// An engine's open transaction: one connection held across requests.
#[derive(Debug)]
pub(crate) enum Session {
    /// A SQLite connection of its own, on a thread of its own.
    Sqlite(sqlite::Session),
    /// A pooled PostgreSQL connection, held.
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::Session>),
}

impl Session {
    /// Where the transaction's snapshot stands, when the engine learned it at the open (a
    /// read-only `REPEATABLE READ` one on PostgreSQL: every statement of it sees that snapshot).
    pub(crate) fn position(&self) -> Option<Position> {
        match self {
            Session::Sqlite(_) => None,
            #[cfg(feature = "postgres")]
            Session::Postgres(session) => session.position(),
        }
    }

    /// Whether the engine ended the transaction on its own (rolled back: on SQLite, a write
    /// transaction idle past `--transaction-write-idle`, a read-only one pinning an overgrown
    /// write-ahead log; ADR 0042): the registry then answers it as expired.
    pub(crate) fn must_end(&self) -> bool {
        match self {
            Session::Sqlite(session) => session.must_end(),
            #[cfg(feature = "postgres")]
            Session::Postgres(_) => false,
        }
    }

    /// Runs one statement in the transaction.
    pub(crate) async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        match self {
            Session::Sqlite(session) => session.step(request).await,
            #[cfg(feature = "postgres")]
            Session::Postgres(session) => session.step(request).await,
        }
    }

    /// Commits, with `record` stored in the same transaction; the position after the commit
    /// when the engine has one (see `protocol::bookmark`).
    pub(crate) async fn commit(
        self,
        record: Option<Record>,
    ) -> Result<Option<Bookmark>, CommitError> {
        match self {
            Session::Sqlite(session) => session.commit(record).await.map(|()| None),
            #[cfg(feature = "postgres")]
            Session::Postgres(session) => session.commit(record).await,
        }
    }

    /// Rolls back.
    pub(crate) async fn rollback(self) {
        match self {
            Session::Sqlite(session) => session.rollback().await,
            #[cfg(feature = "postgres")]
            Session::Postgres(session) => session.rollback().await,
        }
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
