//! What runs in an open interactive transaction, each as a task of its own (a client that goes
//! away mid-statement does not cut it short, so its re-send finds the stored result): its
//! statements in sequence ([`Transactions::step`]: the next one runs, the last one is answered
//! again from its kept result, any other is refused), its exactly-once commit with the commit
//! record stored in the same database transaction, its rollback, and how it stands.
//!
//! Knows the engine contract's session calls and the protocol's errors and bodies; nothing
//! about HTTP or either engine's SQL.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use crate::budget::{Budget, Held};
use crate::engine::Outcome;
use crate::engine::interactive::{CommitError, Interactive as _, Record, StepError};
use crate::protocol::bookmark::{Position, ServedBy};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::protocol::transaction::{self as body, Outcome as TxOutcome};
use crate::transactions::ending::{Ending, Op, answer, expired, record_hash, record_key};
use crate::transactions::entry::{Answer, Entry, Kept, Live};
use crate::transactions::registry::Transactions;

/// What a statement is, for [`Kept::statement`].
pub(super) fn statement_digest(request: &SqlRequest) -> [u8; 32] {
    Sha256::new()
        .chain_update(request.sql.as_bytes())
        .chain_update(b"\n")
        .chain_update(format!("{:?}", request.params))
        .finalize()
        .into()
}

impl Transactions {
    /// Runs statement `seq` of the transaction `token`.
    pub(crate) async fn step(
        self: &Arc<Self>,
        owner: &str,
        token: &str,
        seq: u64,
        request: SqlRequest,
    ) -> Result<Answer, ApiError> {
        self.on_open(
            owner,
            token,
            Op::Step,
            move |registry, entry, mut live| async move {
                if seq == live.seq
                    && let Some(kept) = &live.last
                {
                    if kept.statement != statement_digest(&request) {
                        return Err(ApiError::new(
                            ErrorCode::IdempotencyKeyReused,
                            format!(
                                "statement {seq} of this transaction was another statement (other \
                             text or parameters): a re-sent statement must be the same one; \
                             this one was not run (the next number is {})",
                                seq + 1
                            ),
                        ));
                    }
                    // The kept answer again, shared: one copy in memory however many replays
                    // are sent (and left unread), counted once until the last is done.
                    return Ok(kept.answer(true));
                }
                if seq != live.seq + 1 {
                    return Err(ApiError::new(
                        ErrorCode::TransactionStepOutOfOrder,
                        format!(
                            "this transaction's next statement is number {} (the last one, {}, is \
                         answered again); statement {seq} was not run",
                            live.seq + 1,
                            live.seq
                        ),
                    ));
                }
                // The stored result's share of the budget, reserved before anything runs, within
                // its owner's part of what transactions may hold, and within that.
                let mut own = Held::default();
                entry
                    .owner_share
                    .0
                    .results
                    .cover(&mut own, registry.max_result_bytes)
                    .map_err(|_| {
                        ApiError::unavailable(format!(
                            "this credential's open transactions hold as much memory for their \
                             results (and their answers not yet sent) as one credential may (half \
                             of what transactions may hold, a quarter of --max-buffered-bytes); \
                             statement {seq} was not run; retry later"
                        ))
                    })?;
                let mut share = Held::default();
                registry
                    .share
                    .cover(&mut share, registry.max_result_bytes)
                    .map_err(|_| {
                        ApiError::unavailable(format!(
                            "the server's open transactions hold as much memory for their results \
                         as they may (half of --max-buffered-bytes); statement {seq} was not \
                         run; retry later"
                        ))
                    })?;
                let mut held = Held::default();
                registry
                    .budget
                    .cover(&mut held, registry.max_result_bytes)?;
                let digest = statement_digest(&request);
                let Some(session) = live.session.as_mut() else {
                    return Err(expired());
                };
                let ran = session.step(request).await;
                live.last_used = Instant::now();
                let (status, body) = match ran {
                    Ok(body) => (200, body),
                    Err(StepError::Statement(err)) if err.code.is_stored_outcome() => {
                        (err.code.status(), err.body())
                    }
                    Err(StepError::Statement(err)) => return Err(err),
                    Err(StepError::Aborted(err)) => {
                        live.session = None;
                        live.last = None;
                        registry.finish(&entry, Ending::Aborted(err.clone()));
                        return Err(err);
                    }
                };
                for held in [&mut held, &mut share, &mut own] {
                    Budget::shrink(held, body.len());
                }
                let kept = Kept {
                    status,
                    body: Bytes::from(body),
                    statement: digest,
                    held: Arc::new(held.with(share).with(own)),
                };
                let answer = kept.answer(false);
                live.seq = seq;
                live.last = Some(kept);
                Ok(answer)
            },
        )
        .await
    }

    /// Commits the transaction `token`, exactly once.
    pub(crate) async fn commit(
        self: &Arc<Self>,
        owner: &str,
        token: &str,
    ) -> Result<Answer, ApiError> {
        self.on_open(
            owner,
            token,
            Op::Commit,
            |registry, entry, mut live| async move {
                let Some(session) = live.session.take() else {
                    return Err(expired());
                };
                live.last = None;
                let body = body::outcome(TxOutcome::Committed);
                let record = (registry.ttl.is_some() && !entry.options.read_only).then(|| Record {
                    key: record_key(&entry.token),
                    request_hash: record_hash(&entry.owner, &entry.token),
                    body: body.clone(),
                });
                let began = std::time::Instant::now();
                match session.commit(record).await {
                    Ok(bookmark) => {
                        let position = bookmark.map(|bookmark| Position {
                            bookmark,
                            served_by: ServedBy::Primary,
                        });
                        // The answer says what the COMMIT cost; the record stored with it
                        // (read after a restart) cannot, and answers without `stats`.
                        let body = Bytes::from(body::committed(began.elapsed()));
                        registry.finish(&entry, Ending::Committed(body.clone(), position));
                        Ok(Answer {
                            status: 200,
                            body,
                            replayed: false,
                            position,
                            held: Held::default(),
                        })
                    }
                    Err(CommitError::RolledBack(err)) => {
                        let ending = if err.code == ErrorCode::TransactionAborted {
                            Ending::Aborted(err.clone())
                        } else {
                            Ending::Refused(err.clone())
                        };
                        registry.finish(&entry, ending);
                        Err(err)
                    }
                    Err(CommitError::Unknown(err)) => {
                        registry.finish(&entry, Ending::Unknown(Instant::now()));
                        Err(err)
                    }
                }
            },
        )
        .await
    }

    /// Rolls the transaction `token` back (answering how it ended when it already has).
    pub(crate) async fn rollback(
        self: &Arc<Self>,
        owner: &str,
        token: &str,
    ) -> Result<Answer, ApiError> {
        self.on_open(
            owner,
            token,
            Op::Rollback,
            |registry, entry, mut live| async move {
                let Some(session) = live.session.take() else {
                    return Err(expired());
                };
                live.last = None;
                session.rollback().await;
                registry.finish(&entry, Ending::RolledBack);
                Ok(Outcome::fresh(body::outcome(TxOutcome::RolledBack)).into())
            },
        )
        .await
    }

    /// Runs `work` on the open transaction `token` of `owner`, as a task of its own (a client
    /// that goes away mid-way does not cut it short, so its re-send finds what it did), with
    /// the transaction's state locked and its session there. A transaction that is not open
    /// here, or that expired or ended meanwhile, is answered by how it ended, as `op` is.
    pub(super) async fn on_open<F, Fut>(
        self: &Arc<Self>,
        owner: &str,
        token: &str,
        op: Op,
        work: F,
    ) -> Result<Answer, ApiError>
    where
        F: FnOnce(Arc<Self>, Arc<Entry>, tokio::sync::OwnedMutexGuard<Live>) -> Fut
            + Send
            + 'static,
        Fut: Future<Output = Result<Answer, ApiError>> + Send + 'static,
    {
        let Some(entry) = self.find(owner, token) else {
            return self.endings.ended(owner, token, op).await.map(Answer::from);
        };
        let registry = Arc::clone(self);
        let task = tokio::spawn(async move {
            let mut live = Arc::clone(&entry.state).lock_owned().await;
            if registry.expire_if_due(&entry, &mut live) {
                return answer(op, &Ending::Expired).map(Answer::from);
            }
            if live.session.is_none() {
                drop(live);
                let ending = registry
                    .endings
                    .ending_of(&entry.token)
                    .unwrap_or(Ending::Expired);
                return answer(op, &ending).map(Answer::from);
            }
            work(registry, entry, live).await
        });
        task.await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "a transaction's task failed");
            Err(ApiError::internal())
        })
    }

    /// How the transaction `token` stands: `open`, or how it ended.
    pub(crate) async fn outcome(
        self: &Arc<Self>,
        owner: &str,
        token: &str,
    ) -> Result<Answer, ApiError> {
        if self.find(owner, token).is_some() {
            return Ok(Outcome::fresh(body::outcome(TxOutcome::Open)).into());
        }
        self.endings
            .ended(owner, token, Op::Outcome)
            .await
            .map(Answer::from)
    }
}
