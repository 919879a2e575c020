//! Atomic batches on PostgreSQL: a batch's statements in order in ONE transaction of the
//! server's own (`READ ONLY, REPEATABLE READ` for a read-only batch, so its statements see one
//! snapshot; one that asks for `READ COMMITTED` reads the log position again after its last
//! statement, for its bookmark), answered `{"results": [...]}` through the shared `BatchBody`; keyed batches go
//! through `keyed` (the engine's trait methods in `mod.rs` choose which). Knows nothing about
//! HTTP.

use crate::engine::Access;
use crate::engine::batch_body::BatchBody;
use crate::engine::interactive::Isolation;
use crate::engine::postgres::in_transaction;
use crate::engine::postgres::in_transaction::{Open, Work};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::transaction;
use crate::engine::postgres::{Inner, Job, exec};
use crate::engine::stream::Sink;
use crate::protocol::batch::{BatchRequest, ForeignKeys};
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

/// Runs a batch without an Idempotency-Key in one transaction.
pub(super) async fn batch(
    inner: &Inner,
    job: &Job,
    batch: &BatchRequest,
) -> Result<Vec<u8>, ApiError> {
    let mode = if batch.read_only {
        Access::ReadOnly
    } else {
        Access::ReadWrite
    };
    let lease = inner.lease(job).await?;
    let open = Open::Batch(batch.isolation);
    let statements = Statements {
        inner,
        statements: &batch.statements,
        // A read whose statements each take their own snapshot: its bookmark must cover
        // the last one's, not only what its `BEGIN` saw.
        position_after: batch.read_only && batch.isolation == Some(Isolation::ReadCommitted),
    };
    in_transaction::in_transaction(
        inner,
        job,
        lease,
        mode,
        open,
        batch.statements.len(),
        statements,
    )
    .await
}

/// Runs the statements in order inside the open transaction and answers
/// `{"results": [...]}`; the first failure stops the batch and names its statement.
pub(super) async fn run_statements(
    inner: &Inner,
    lease: &Lease,
    statements: &[SqlRequest],
) -> Result<Vec<u8>, ApiError> {
    let limit = inner.limits.max_result_bytes;
    let map = |e| inner.map(&e);
    let mut answer = BatchBody::new(limit, statements.len());
    for (index, statement) in statements.iter().enumerate() {
        let mut body = Vec::with_capacity(256);
        let mut sink = Sink::Buffered { limit };
        let limits = &inner.limits;
        let ran = exec::write_result(
            lease,
            statement,
            limits,
            &mut body,
            &mut sink,
            &map,
            exec::Around::default(),
        )
        .await
        .map(|()| body);
        answer.push_result(index, ran)?;
    }
    Ok(answer.finish())
}

/// A batch's statements, run in order in the transaction open on a lease (see
/// [`run_statements`]).
struct Statements<'a> {
    inner: &'a Inner,
    statements: &'a [SqlRequest],
    /// Whether the log position is read again once they ran (a read at `READ COMMITTED`).
    position_after: bool,
}

impl Work for Statements<'_> {
    type Output = Vec<u8>;

    async fn run(&mut self, lease: &Lease) -> Result<Vec<u8>, ApiError> {
        let inner = self.inner;
        let answer = run_statements(inner, lease, self.statements).await?;
        if self.position_after {
            // Read after every statement's snapshot was taken: at or past all they saw. Under
            // the server's statement timeout, which a client's function may have lowered.
            let select = format!(
                "SET LOCAL statement_timeout = {}; SELECT {}",
                inner.timeout_ms(),
                inner.node.position_sql()
            );
            transaction::learn_position(inner, lease, lease.client().simple_query(&select).await)?;
        }
        Ok(answer)
    }
}

/// PostgreSQL enforces foreign keys as declared: it alters tables in place, so no batch needs
/// them off (and `SET CONSTRAINTS` defers checks only, never `ON DELETE` actions).
pub(super) fn only_enforced(batch: &BatchRequest) -> Result<(), ApiError> {
    match batch.foreign_keys {
        ForeignKeys::Enforced => Ok(()),
        ForeignKeys::CheckedAtCommit => Err(ApiError::bad_request(
            "`foreign_keys: checked_at_commit` is for SQLite, whose table rebuilds drop tables \
             that others refer to; PostgreSQL alters tables in place and enforces foreign keys \
             as declared: leave it out",
        )),
    }
}
