//! Interactive transactions: [`TransactionBuilder`] (made by [`Client::transaction`]) opens a
//! [`Transaction`] on the server, whose statements run in it in order until
//! [`Transaction::commit`] or [`Transaction::rollback`] (each consumes it); [`Client::transact`]
//! runs a closure in one and runs it again when the transaction is lost before it commits.
//!
//! A transaction hands out the client's own builders ([`Query`](crate::Query),
//! [`TableQuery`](crate::TableQuery), [`Execute`](crate::Execute), [`Insert`](crate::Insert)):
//! they reach this module through [`Handle::step`], which turns a statement's `/api/v1/sql` body
//! into the transaction's next step, and through [`Replay`], which reads a streamed step's stored
//! result again after its answer was lost part-way (ADR 0047).
//!
//! Every step is safe to send twice, so the transport retries each as the client's policy
//! allows: a statement carries its number in the transaction (the server answers a re-sent one
//! from its stored result), the open and the COMMIT carry an idempotency key (the server answers
//! a re-sent one with the same transaction, or the stored outcome). This module knows the
//! transaction endpoints' bodies and the order of steps; the retry rules are the transport's, the
//! decoding of rows the builders' and the cursor's.
//!
//! Two rules keep a retry from reporting what did not happen. A statement whose outcome is
//! unknown after every retry (no answer, a gateway's `504`, `503 OUTCOME_UNKNOWN`) ends the
//! transaction: it is rolled back and its COMMIT is never sent, since the statement may or may
//! not be in it. A COMMIT whose outcome is unknown is settled by asking the server how the
//! transaction ended (`/outcome`), within the call's retry policy, before the SDK gives up.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sqlhttp_protocol::ErrorCode;
use sqlhttp_protocol::body::{Outcome, TransactionOutcome, member};

use crate::client::Client;
use crate::cursor::Reread;
use crate::error::{Error, ErrorKind, Result};
use crate::insert::Insert;
use crate::options::CallOptions;
use crate::retry::backoff;
use crate::retry::classify::OpClass;
use crate::statement::{Execute, Query, ResponseFuture, TableQuery, Target};
use crate::transport::{Call, Delivered, Endpoint, Receive, TxStep};
use tokio::time::Instant;
use tracing::Instrument;

/// A transaction's isolation level: the protocol's (`sqlhttp_protocol::Isolation`, ADR 0048),
/// re-exported. On PostgreSQL one of two conflicting [`Isolation::Serializable`] transactions
/// fails with [`ErrorKind::TransactionLost`], and [`Client::transact`] runs it again.
pub use sqlhttp_protocol::Isolation;

/// Opens an interactive transaction; made by [`Client::transaction`]. Await it for the
/// [`Transaction`].
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// let tx = client.transaction().await?;
/// let balance: i64 = tx
///     .query("SELECT balance FROM accounts WHERE id = ?")
///     .bind(1)
///     .fetch_one()
///     .await?;
/// if balance >= 25 {
///     tx.execute("UPDATE accounts SET balance = balance - 25 WHERE id = ?").bind(1).await?;
///     tx.execute("UPDATE accounts SET balance = balance + 25 WHERE id = ?").bind(2).await?;
/// }
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a transaction opens when it is awaited"]
pub struct TransactionBuilder {
    client: Client,
    read_only: bool,
    isolation: Isolation,
    deferrable: bool,
}

impl TransactionBuilder {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            read_only: false,
            isolation: Isolation::default(),
            deferrable: false,
        }
    }

    /// With `true`, opens a read-only transaction: its statements see one snapshot and any that
    /// writes is refused ([`ErrorKind::ReadOnly`]). On SQLite it does not hold the write lock.
    /// Default: `false`.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Opens the transaction at `isolation` (default [`Isolation::Serializable`]).
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// With `true`, for a read-only serializable transaction: wait for a snapshot that can never
    /// fail to serialize (PostgreSQL's `DEFERRABLE`; every SQLite read is one). Default: `false`.
    pub fn deferrable(mut self, deferrable: bool) -> Self {
        self.deferrable = deferrable;
        self
    }

    async fn open(self) -> Result<Transaction> {
        #[derive(Deserialize)]
        struct Opened {
            transaction: String,
        }
        let body = serde_json::to_vec(&sqlhttp_protocol::body::TransactionOpenRequest {
            read_only: Some(self.read_only),
            isolation: Some(self.isolation),
            deferrable: Some(self.deferrable),
        })
        .map_err(Error::decode)?;
        // The transaction's span: its steps' call spans are its children, from BEGIN to the
        // COMMIT or ROLLBACK; it ends when the transaction and what it handed out are gone.
        let span = tracing::info_span!(
            "sqlhttp.transaction",
            otel.name = "TRANSACTION",
            read_only = self.read_only,
            isolation = self.isolation.as_str(),
            run = tracing::field::Empty,
            rerun = tracing::field::Empty,
        );
        let answer = send(&self.client, TxStep::Open, Bytes::from(body), "BEGIN")
            .instrument(span.clone())
            .await?;
        let Opened { transaction } = serde_json::from_slice(&answer).map_err(Error::decode)?;
        if transaction.is_empty()
            || !transaction
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.')
        {
            return Err(Error::new(ErrorKind::Decode {
                row: None,
                column: None,
                message: "the server answered a transaction token of unexpected characters"
                    .to_owned(),
            }));
        }
        Ok(Transaction {
            handle: Handle(Arc::new(Shared {
                client: self.client,
                token: transaction,
                state: tokio::sync::Mutex::new(State::default()),
                span,
            })),
        })
    }
}

impl IntoFuture for TransactionBuilder {
    type Output = Result<Transaction>;
    type IntoFuture = ResponseFuture<'static, Transaction>;

    fn into_future(self) -> Self::IntoFuture {
        ResponseFuture::new(self.open())
    }
}

/// Sends one transaction step (retried as the client's policy allows) and returns its whole
/// success body.
async fn send(client: &Client, step: TxStep, body: Bytes, sql: &str) -> Result<Vec<u8>> {
    send_since(client, step, body, sql, None).await
}

/// [`send`], for a step whose retry policy's `max_elapsed` counts from `started` (the asks after
/// a COMMIT share the COMMIT's).
async fn send_since(
    client: &Client,
    step: TxStep,
    body: Bytes,
    sql: &str,
    started: Option<Instant>,
) -> Result<Vec<u8>> {
    let options = CallOptions::default();
    let mut whole = crate::cursor::Whole::default();
    let call = Call {
        class: OpClass::Step,
        endpoint: Endpoint::Transaction(step),
        body,
        sql,
        options: &options,
        idempotency_key: None,
        started,
    };
    client.send(call, &mut whole).await?;
    Ok(whole.0)
}

/// An open interactive transaction on the server: statements run in it in order until
/// [`commit`](Self::commit) or [`rollback`](Self::rollback), each of which consumes it.
///
/// **The client's statements.** [`query`](Self::query), [`query_table`](Self::query_table),
/// [`execute`](Self::execute) and [`insert`](Self::insert) hand out the very builders
/// [`Client`] does ([`Query`], [`TableQuery`], [`Execute`], [`Insert`]), with the same finishing
/// calls and per-call [`timeout`](Query::timeout) and [`cancel_on`](Query::cancel_on), and
/// awaiting one means what it means on the client (see the crate's front page). Code written
/// once against [`Executor`](crate::Executor) runs on both. Its statements are sent one at a
/// time, in the order they are awaited.
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// let tx = client.transaction().await?;
/// let mut ids = tx.query("SELECT id FROM events ORDER BY id").fetch::<i64>();
/// while let Some(id) = ids.try_next().await? {
///     println!("{id}");
/// }
/// let moved = tx.execute("UPDATE events SET archived = 1").await?;
/// println!("{} archived", moved.rows_affected);
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
///
/// A committed (or rolled back) transaction is gone: using it again does not compile.
///
/// ```compile_fail
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// let tx = client.transaction().await?;
/// tx.commit().await?;
/// tx.execute("DELETE FROM t").await?;
/// # Ok(())
/// # }
/// ```
///
/// **Retries.** Every step is retried as the client's [`RetryPolicy`](crate::RetryPolicy)
/// (or the call's [`retry`](Query::retry)) allows, whatever `retry_writes` says, an
/// [`execute`](Self::execute) too: the server answers a re-sent statement from its stored
/// result instead of running it again, and a re-sent COMMIT with its stored outcome. A
/// transaction that cannot go on fails with [`ErrorKind::TransactionLost`] (nothing of it was
/// committed): it expired on the server (idle longer than the server's
/// `--transaction-idle-timeout`, 10 s by default), failed to serialize, or deadlocked.
///
/// **A statement whose outcome is unknown** (every attempt timed out, lost its connection, was
/// cancelled once sent, or was answered `504` by a gateway or `503 OUTCOME_UNKNOWN` by the
/// server: its error's [`Error::is_outcome_unknown`] is set; or its call was dropped once it
/// began, by a `tokio::time::timeout` or a `select!`, or a stream dropped before its first
/// row, which is taken as sent) ends the transaction: the SDK rolls
/// it back, and every later statement and [`commit`](Self::commit) fails with
/// [`ErrorKind::TransactionLost`] without being sent. The statement may or may not be in the
/// transaction, so committing it would commit what the SDK reported as failed. A statement the
/// server refused with a final verdict (`SQL_ERROR`, `CONSTRAINT_VIOLATION`,
/// `STATEMENT_NOT_ALLOWED`, `READ_ONLY`, `STATEMENT_TIMEOUT`, `RESULT_TOO_LARGE`,
/// `IDEMPOTENCY_KEY_REUSED`, ...) was undone, and the transaction goes on.
///
/// **A streamed statement** ([`Query::fetch`]) has run whole on the server before its first row
/// arrives: the server keeps its result (up to `--max-result-bytes`; a larger one is refused
/// before any row is sent: `422 RESULT_TOO_LARGE`, undone, the transaction going on; on
/// PostgreSQL, when the server cannot undo it within a second, the transaction is lost,
/// [`ErrorKind::TransactionLost`]). When the connection breaks
/// part-way, the stream sends the statement again under its number, skips the rows it already
/// gave, and goes on; this fails (and the stream ends with the error) only once a later
/// statement of the transaction has been sent, since the server keeps the last result only.
///
/// **Settings that cannot apply** in a transaction fail the call with [`ErrorKind::Config`]
/// before anything is sent: a read's [`consistency`](Query::consistency) or
/// [`bookmark`](Query::bookmark) (the transaction reads its own snapshot; open it with
/// the options you need) and an insert's
/// [`idempotency_key`](crate::Insert::idempotency_key) (the statement's number is its key).
///
/// **Dropping** an uncommitted transaction rolls it back (once the builders and streams it made
/// are gone too): in a background task when a tokio runtime is at hand, else by the server's
/// idle timeout. Until then, on SQLite, a write transaction holds the database's write lock;
/// commit or roll back promptly.
pub struct Transaction {
    handle: Handle,
}

/// The transaction a statement builder runs in (see `statement::Target`): shared by the
/// [`Transaction`] and the builders and streams it made.
#[derive(Clone)]
pub(crate) struct Handle(Arc<Shared>);

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction").finish_non_exhaustive()
    }
}

struct Shared {
    client: Client,
    token: String,
    state: tokio::sync::Mutex<State>,
    /// The transaction's span (`sqlhttp.transaction`), the parent of its steps' calls.
    span: tracing::Span,
}

#[derive(Default)]
struct State {
    /// The number of the last statement the server ran.
    seq: u64,
    /// Committed, rolled back, or lost: nothing more is sent.
    ended: bool,
    /// Why it was lost, when it was: every later step fails with
    /// [`ErrorKind::TransactionLost`] saying so.
    lost: Option<(String, String)>,
    /// Set when a COMMIT or ROLLBACK returned `Ok` (for [`Client::transact`], whose work may
    /// end the transaction itself).
    finished: bool,
    /// The number of a statement whose call is out: set before it is sent, cleared when the
    /// call comes back, whatever it says. Found set by the next step, the call was dropped by
    /// its caller (a timeout, a `select!`, a stream dropped before its first row) after it may
    /// have been sent: whether the statement ran is unknown (ADR 0047).
    in_flight: Option<u64>,
}

impl State {
    /// The error for a step of a transaction that has ended.
    fn ended(&self) -> Error {
        match &self.lost {
            Some((code, message)) => Error::new(ErrorKind::TransactionLost {
                code: code.clone(),
                message: message.clone(),
            }),
            None => Error::config(
                "this transaction has ended (committed or rolled back); nothing more runs in it",
            ),
        }
    }

    /// Ends the transaction as lost: later steps fail with `code` and `message`.
    fn lose(&mut self, code: &str, message: String) {
        self.ended = true;
        self.lost = Some((code.to_owned(), message));
    }

    /// Ends the transaction as lost when a statement's call was dropped while it was out;
    /// `true` when it did (the caller sends the ROLLBACK).
    fn lose_abandoned(&mut self) -> bool {
        let Some(seq) = self.in_flight.take() else {
            return false;
        };
        self.lose(
            ErrorCode::TransactionAborted.as_str(),
            format!(
                "statement {seq} of this transaction was dropped by its caller (a timeout, a \
                 `select!`, a stream dropped before its first row) after it may have been sent, \
                 so whether it ran is unknown; the SDK rolled the transaction back, and nothing \
                 of it was committed"
            ),
        );
        true
    }
}

/// Armed while a statement's call is out. Dropped armed (its caller dropped the call), it rolls
/// the transaction back at once in a background task, as for a statement whose outcome is
/// unknown; without a runtime, the next step does (the mark `State::in_flight` tells it).
struct InFlight(Option<Handle>);

impl InFlight {
    /// The call came back: nothing to do.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(handle) = self.0.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            // Loses and rolls back the transaction, unless a step got there first.
            let _ = handle.lock_to_send().await;
        });
    }
}

impl fmt::Debug for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction").finish_non_exhaustive()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.state.get_mut().ended {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        let body = named(&self.token);
        let span = self.span.clone();
        runtime.spawn(
            async move {
                if let Err(err) = send(&client, TxStep::Rollback, body, "ROLLBACK").await {
                    tracing::debug!(error = %err, "cannot roll back a dropped transaction; the server's idle timeout will");
                }
            }
            .instrument(span),
        );
    }
}

/// `{"transaction": token}` (a token is letters, digits and dots: checked at open).
fn named(token: &str) -> Bytes {
    let body = sqlhttp_protocol::body::TransactionNamed { transaction: token };
    Bytes::from(serde_json::to_vec(&body).expect("a string always serializes"))
}

impl Transaction {
    fn target(&self) -> Target {
        Target::Transaction(self.handle.clone())
    }

    /// A read in the transaction whose rows are decoded into a type of yours: the client's
    /// [`Query`], with every finishing call ([`fetch`](Query::fetch) streams). Sees the
    /// transaction's snapshot and its own writes.
    pub fn query(&self, sql: impl Into<String>) -> Query {
        Query::new(self.target(), sql.into())
    }

    /// A read in the transaction whose result comes back as a [`Table`](crate::Table): the
    /// client's [`TableQuery`]; `.await` it.
    pub fn query_table(&self, sql: impl Into<String>) -> TableQuery {
        TableQuery::new(self.target(), sql.into())
    }

    /// A statement run in the transaction for its effect: the client's [`Execute`]. `.await` it
    /// for the rows affected and the last insert id ([`ExecResult`](crate::ExecResult)), or fetch
    /// the rows of its `RETURNING` clause. Unlike [`Client::execute`], retried: the server answers
    /// a re-sent statement of a transaction from its stored result.
    pub fn execute(&self, sql: impl Into<String>) -> Execute {
        Execute::new(self.target(), sql.into())
    }

    /// Inserts `rows` in the transaction, split into statements as [`Client::insert`] does;
    /// `.await` it for the number of rows inserted. Each statement is a step of the transaction
    /// (retried as every step is); they commit with it. A failure part-way leaves the earlier
    /// statements' rows in the transaction ([`Error::rows_inserted`] counts them): roll back to
    /// drop them. [`Insert::atomic`] adds nothing here.
    pub fn insert<'r, T: Serialize + Sync>(&self, table: &str, rows: &'r [T]) -> Insert<'r, T> {
        Insert::new(self.target(), table.to_owned(), rows)
    }

    /// Commits. Once this returns `Ok`, the transaction committed, exactly once, however many
    /// attempts it took.
    ///
    /// When the COMMIT's outcome is unknown after its retries (`503 OUTCOME_UNKNOWN`, timeouts,
    /// lost connections, a `5xx` after an attempt was sent), the SDK asks the server how the
    /// transaction ended (`POST /api/v1/transaction/outcome`), with backoff, until the server knows
    /// or the client's retry policy allows no more: until `max_elapsed` from the COMMIT's start
    /// when the policy has one, else `max_attempts` asks; the client's cancellation token and
    /// retry budget stop it too. `committed` returns `Ok` (and its bookmark is taken);
    /// `rolled_back`, `expired` or `aborted` return [`ErrorKind::TransactionLost`]; `open` (no
    /// COMMIT reached the server) sends the COMMIT again.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::TransactionLost`] when it was lost before it committed (nothing of it was
    /// kept: [`Client::transact`] runs it again); a constraint checked at commit; or the failure
    /// of the call after retries. When the server still could not say whether it committed, the
    /// error has [`Error::is_outcome_unknown`] set: it may have committed, and
    /// [`Client::transact`] does not run it again.
    pub async fn commit(self) -> Result<()> {
        let mut state = self.handle.lock_to_send().await?;
        state.ended = true;
        let started = Instant::now();
        let committed = match self.send_commit(started).await {
            Ok(_) => Ok(()),
            Err(err) if commit_unsettled(&err) => self.settle(err, started).await,
            Err(err) => Err(err),
        };
        state.finished = committed.is_ok();
        committed
    }

    /// Sends the COMMIT, under the call's limits counted from `started`.
    async fn send_commit(&self, started: Instant) -> Result<Vec<u8>> {
        send_since(
            &self.handle.0.client,
            TxStep::Commit,
            named(&self.handle.0.token),
            "COMMIT",
            Some(started),
        )
        .instrument(self.handle.0.span.clone())
        .await
    }

    /// Asks the server how the transaction ended after a COMMIT whose outcome is unknown, until
    /// it knows or the retry policy, the budget or a cancellation allows no more; then the
    /// COMMIT's error, its outcome marked unknown.
    async fn settle(&self, err: Error, started: Instant) -> Result<()> {
        let client = &self.handle.0.client;
        let transport = client.transport();
        let policy = transport.policy;
        let deadline = policy
            .max_elapsed
            .and_then(|limit| started.checked_add(limit));
        let mut asked: u32 = 0;
        loop {
            // Without a ceiling in time, the policy's attempts bound the asks.
            if deadline.is_none() && asked >= policy.max_attempts {
                break;
            }
            let delay = {
                let mut rng = transport
                    .rng
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                backoff::delay(&policy, asked + 1, &mut *rng)
            };
            let wakes = Instant::now().checked_add(delay);
            if let Some(deadline) = deadline
                && wakes.is_none_or(|wakes| wakes >= deadline)
            {
                break;
            }
            if let Some(bucket) = &transport.budget
                && !bucket.withdraw(bucket.settings().retry_cost())
            {
                return Err(err
                    .with_outcome_unknown()
                    .with_budget_exhausted()
                    .with_retry_state(transport.retry_state()));
            }
            tokio::select! {
                biased;
                () = crate::transport::cancelled(None, transport.cancel.as_ref()) => break,
                () = tokio::time::sleep(delay) => {}
            }
            asked += 1;
            let answer = send_since(
                client,
                TxStep::Outcome,
                named(&self.handle.0.token),
                "OUTCOME",
                Some(started),
            )
            .instrument(self.handle.0.span.clone())
            .await;
            let outcome = match answer {
                Ok(body) => match serde_json::from_slice::<TransactionOutcome>(&body) {
                    Ok(TransactionOutcome { outcome, .. }) => outcome,
                    // Not an answer this version reads: ask again.
                    Err(_) => continue,
                },
                Err(asking) if asking.is_retryable() => continue,
                // The server cannot tell (it no longer knows the transaction, say), or the
                // client was cancelled.
                Err(_) => break,
            };
            tracing::debug!(
                asked,
                outcome = outcome.as_str(),
                "asked how the transaction ended"
            );
            match outcome {
                Outcome::Committed => return Ok(()),
                Outcome::RolledBack | Outcome::Aborted => {
                    return Err(lost_at_commit(
                        &err,
                        ErrorCode::TransactionAborted.as_str(),
                        outcome,
                    ));
                }
                Outcome::Expired => {
                    return Err(lost_at_commit(
                        &err,
                        ErrorCode::TransactionExpired.as_str(),
                        outcome,
                    ));
                }
                // No COMMIT reached it (a gateway answered for the server, say): it is still
                // open, so nothing of it committed, and the COMMIT asked for is sent again.
                Outcome::Open => match self.send_commit(started).await {
                    Ok(_) => return Ok(()),
                    Err(again) if commit_unsettled(&again) => {}
                    Err(again) => return Err(again),
                },
                // `unknown`, or an outcome this version does not know: not known yet.
                Outcome::Unknown => {}
            }
        }
        tracing::warn!(
            asked,
            error = %err,
            "the COMMIT's outcome is still unknown; giving up"
        );
        Err(err.with_outcome_unknown())
    }

    /// Rolls back: nothing of the transaction is kept.
    ///
    /// # Errors
    ///
    /// The failure of the call after retries (the server's idle timeout then rolls it back).
    pub async fn rollback(self) -> Result<()> {
        let mut state = self.handle.lock_to_send().await?;
        state.ended = true;
        let rolled_back = send(
            &self.handle.0.client,
            TxStep::Rollback,
            named(&self.handle.0.token),
            "ROLLBACK",
        )
        .instrument(self.handle.0.span.clone())
        .await
        .map(drop);
        state.finished = rolled_back.is_ok();
        rolled_back
    }
}

impl Handle {
    /// The client the transaction was opened by (its limits, its transport).
    pub(crate) fn client(&self) -> &Client {
        &self.0.client
    }

    /// The transaction's state, locked for a step that sends (a statement, a re-read, the
    /// COMMIT, the ROLLBACK). A transaction that has ended fails it; so does one a statement of
    /// which was dropped by its caller after it may have been sent: it is lost then, and rolled
    /// back here (its COMMIT is never sent).
    async fn lock_to_send(&self) -> Result<tokio::sync::MutexGuard<'_, State>> {
        let mut state = self.0.state.lock().await;
        if state.lose_abandoned() {
            let err = state.ended();
            drop(state);
            self.roll_back_lost().await;
            return Err(err);
        }
        if state.ended {
            return Err(state.ended());
        }
        Ok(state)
    }

    /// Rolls back a transaction the SDK has ended as lost (its state says so already).
    async fn roll_back_lost(&self) {
        if let Err(err) = send(
            &self.0.client,
            TxStep::Rollback,
            named(&self.0.token),
            "ROLLBACK",
        )
        .instrument(self.0.span.clone())
        .await
        {
            tracing::debug!(error = %err, "cannot roll back a transaction whose statement has an unknown outcome; the server's idle timeout will");
        }
    }

    /// Sends `call` (a statement's `/api/v1/sql` body, as the client would send it) as the
    /// transaction's next statement, retried as every step is; hands the answer to `receiver`
    /// as the client's call would. Returns what a stream needs to read the stored result again.
    ///
    /// The call's class is the builder's (read, write, execute); in a transaction every
    /// statement is a step, retried the same way, so only the body and the options travel.
    pub(crate) async fn step(
        &self,
        call: Call<'_>,
        receiver: &mut dyn Receive,
    ) -> Result<(Delivered, Replay)> {
        check_options(call.options)?;
        // Dropped while it waits here, the step sent nothing: the transaction goes on.
        let mut state = self.lock_to_send().await?;
        let seq = state.seq + 1;
        // `{"sql": ...}` becomes `{"transaction": ..., "seq": n, "sql": ...}`.
        let mut body = format!(
            "{{\"{}\":\"{}\",\"{}\":{seq},",
            member::TRANSACTION,
            self.0.token,
            member::SEQ
        )
        .into_bytes();
        body.extend_from_slice(&call.body[1..]);
        let body = Bytes::from(body);
        let step = Call {
            class: OpClass::Step,
            endpoint: Endpoint::Transaction(TxStep::Statement),
            body: body.clone(),
            sql: call.sql,
            options: call.options,
            idempotency_key: None,
            started: call.started,
        };
        // From here the request may be on the wire, and nothing outside the transport can tell
        // whether it is: a call dropped before it comes back leaves the mark, which loses the
        // transaction (ADR 0047).
        state.in_flight = Some(seq);
        let in_flight = InFlight(Some(self.clone()));
        let sent = self
            .0
            .client
            .send(step, receiver)
            .instrument(self.0.span.clone())
            .await;
        in_flight.disarm();
        state.in_flight = None;
        match sent {
            Ok(delivered) => {
                state.seq = seq;
                let replay = Replay {
                    handle: self.clone(),
                    seq,
                    body,
                    sql: call.sql.to_owned(),
                    options: call.options.clone(),
                };
                Ok((delivered, replay))
            }
            Err(err) => {
                match step_verdict(&err) {
                    Verdict::Stored => state.seq = seq,
                    Verdict::Undone => {}
                    Verdict::Lost => {
                        let message = match err.kind() {
                            ErrorKind::TransactionLost { message, .. } => message.clone(),
                            _ => String::new(),
                        };
                        let code = err.code().unwrap_or(ErrorCode::TransactionAborted.as_str());
                        state.lose(code, message);
                    }
                    Verdict::Unknown => {
                        // Whether it ran is unknown, so nothing more may follow it, and the
                        // transaction must never commit: it is rolled back.
                        state.lose(
                            ErrorCode::TransactionAborted.as_str(),
                            format!(
                                "statement {seq} of this transaction has an unknown outcome \
                                 ({err}); the SDK rolled the transaction back, and nothing of it \
                                 was committed"
                            ),
                        );
                        drop(state);
                        self.roll_back_lost().await;
                    }
                }
                Err(err)
            }
        }
    }

    /// Whether the transaction was committed or rolled back by a caller (not lost).
    async fn finished(&self) -> bool {
        self.0.state.lock().await.finished
    }
}

/// Refuses, before anything is sent, the per-call settings a transaction's statement cannot
/// honour.
fn check_options(options: &CallOptions) -> Result<()> {
    if options.consistency.is_some() || options.bookmark.is_some() {
        return Err(Error::config(
            "a statement in a transaction reads the transaction's snapshot: `consistency` and \
             `bookmark` cannot apply to it (open the transaction with the options it needs)",
        ));
    }
    if options.idempotency_key.is_some() {
        return Err(Error::config(
            "a statement in a transaction is keyed by its number in the transaction: an \
             `idempotency_key` of the caller's cannot apply to it",
        ));
    }
    Ok(())
}

/// A streamed statement's step, kept to read its stored result again: the same body under the
/// same number, which the server answers from the result it kept (ADR 0047).
pub(crate) struct Replay {
    handle: Handle,
    seq: u64,
    body: Bytes,
    sql: String,
    options: CallOptions,
}

impl Reread for Replay {
    fn reread<'a>(
        &'a self,
        receiver: &'a mut dyn Receive,
    ) -> Pin<Box<dyn Future<Output = Result<Delivered>> + Send + 'a>> {
        Box::pin(async move {
            // A re-read sends again what the server has answered and kept: dropped, it leaves
            // nothing unknown, so it sets no mark.
            let state = self.handle.lock_to_send().await?;
            if state.seq != self.seq {
                return Err(Error::config(format!(
                    "statement {} of this transaction cannot be read again: statement {} has \
                     been sent since, and the server keeps the last statement's result only",
                    self.seq, state.seq
                )));
            }
            let call = Call {
                class: OpClass::Step,
                endpoint: Endpoint::Transaction(TxStep::Statement),
                body: self.body.clone(),
                sql: &self.sql,
                options: &self.options,
                idempotency_key: None,
                started: None,
            };
            let delivered = self
                .handle
                .0
                .client
                .send(call, receiver)
                .instrument(self.handle.0.span.clone())
                .await;
            drop(state);
            delivered
        })
    }
}

/// What a failed statement's error says of the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The server's final verdict on the statement, stored as its answer: the transaction goes
    /// on after it (the next statement takes the next number).
    Stored,
    /// Refused before it ran, or undone and not stored: the transaction goes on before it.
    Undone,
    /// The server ended the transaction (`TRANSACTION_EXPIRED`, `TRANSACTION_ABORTED`).
    Lost,
    /// Whether it ran is unknown (or nothing the server said settles it): the transaction must
    /// end uncommitted.
    Unknown,
}

fn step_verdict(err: &Error) -> Verdict {
    if err.is_outcome_unknown() {
        return Verdict::Unknown;
    }
    match err.kind() {
        // The server's final verdict, stored; or a row of a success answer that the caller's
        // type cannot take (`fetch_one::<T>` of the wrong `T`): the server answered the result
        // it ran and kept. A body that is not a result at all (no row named) may not be the
        // server's: unknown, below.
        ErrorKind::Sql { .. }
        | ErrorKind::ConstraintViolation { .. }
        | ErrorKind::StatementNotAllowed { .. }
        | ErrorKind::Decode { row: Some(_), .. } => Verdict::Stored,
        // Refused before anything was sent (a setting that cannot work, a call cancelled
        // before it went out), or refused by the server before it ran.
        ErrorKind::Cancelled if !err.is_sent() => Verdict::Undone,
        ErrorKind::Config { .. }
        | ErrorKind::ReadOnly { .. }
        | ErrorKind::StatementTimeout { .. }
        | ErrorKind::PayloadTooLarge { .. }
        | ErrorKind::InvalidParameter { .. }
        | ErrorKind::BookmarkAhead { .. } => Verdict::Undone,
        // A refusal of the request (`IDEMPOTENCY_KEY_REUSED`, `RESULT_TOO_LARGE`,
        // `BAD_REQUEST`, `TRANSACTION_STEP_OUT_OF_ORDER`, ...); not a request timeout, which
        // a gateway may answer after forwarding the request.
        ErrorKind::Http { status, .. } if (400..500).contains(status) && *status != 408 => {
            Verdict::Undone
        }
        ErrorKind::TransactionLost { .. } => Verdict::Lost,
        _ => Verdict::Unknown,
    }
}

/// Whether a COMMIT's failure leaves its outcome to be asked: an attempt was sent and no answer
/// settled it (timeouts, lost connections, `502`/`504`, `503 OUTCOME_UNKNOWN`), or the server
/// failed (`5xx`) after it was sent. A cancellation is the caller's limit: not asked.
fn commit_unsettled(err: &Error) -> bool {
    if !err.is_sent() || matches!(err.kind(), ErrorKind::Cancelled) {
        return false;
    }
    err.is_outcome_unknown()
        || matches!(err.kind(), ErrorKind::Http { status, .. } if (500..600).contains(status))
}

/// The error of a COMMIT the server says ended without committing (`outcome` is its word).
fn lost_at_commit(err: &Error, code: &str, outcome: Outcome) -> Error {
    let attempts = err.attempts();
    let history = err.history().to_vec();
    Error::new(ErrorKind::TransactionLost {
        code: code.to_owned(),
        message: format!(
            "the COMMIT's answer was lost, and the server says the transaction {}: nothing of \
             it was committed",
            match outcome {
                Outcome::RolledBack => "was rolled back",
                Outcome::Expired => "expired",
                _ => "was aborted",
            }
        ),
    })
    .with_attempts(attempts, history)
    .with_sent(true, false)
}

impl Client {
    /// Starts an interactive transaction; await the builder for the [`Transaction`].
    pub fn transaction(&self) -> TransactionBuilder {
        TransactionBuilder::new(self.clone())
    }

    /// Runs `work` in a transaction and commits it; when the transaction is lost before it
    /// commits ([`ErrorKind::TransactionLost`]: a serialization failure, a deadlock, expiry, its
    /// server restarted), runs `work` again in a new one, with the client's retry policy
    /// (attempts, backoff, `max_elapsed`) and retry budget. Any other error of `work` rolls the
    /// transaction back and is returned. `work` may run more than once: keep side effects
    /// outside the database out of it.
    ///
    /// `work` takes the [`Transaction`] by value (see ADR 0047): it may end it itself, with
    /// [`commit`](Transaction::commit) or [`rollback`](Transaction::rollback) (a decision to
    /// roll back and return `Ok` stands; nothing is committed then); when it returns `Ok` with
    /// the transaction still open, `transact` commits it.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// let moved: bool = client
    ///     .transact(|tx| async move {
    ///         let balance: i64 = tx
    ///             .query("SELECT balance FROM accounts WHERE id = ?").bind(1)
    ///             .fetch_one().await?;
    ///         if balance < 25 {
    ///             tx.rollback().await?;
    ///             return Ok(false);
    ///         }
    ///         tx.execute("UPDATE accounts SET balance = ? WHERE id = ?")
    ///             .bind(balance - 25).bind(1).await?;
    ///         tx.execute("UPDATE accounts SET balance = balance + 25 WHERE id = ?")
    ///             .bind(2).await?;
    ///         Ok(true)
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The last [`ErrorKind::TransactionLost`] once the policy or the budget allows no more
    /// runs; any other error of `work`, of opening the transaction, or of its commit.
    pub async fn transact<T, F, Fut>(&self, mut work: F) -> Result<T>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let transport = self.transport();
        let policy = transport.policy;
        let started = tokio::time::Instant::now();
        let mut run = 0;
        loop {
            run += 1;
            let tx = self.transaction().await?;
            // `transact`'s runs on the transaction's span: a run after the first is a re-run of
            // the work, after the one before was lost.
            tx.handle.0.span.record("run", run);
            tx.handle.0.span.record("rerun", run > 1);
            let given = Transaction {
                handle: tx.handle.clone(),
            };
            let outcome = match work(given).await {
                // The work committed or rolled back itself: its decision stands.
                Ok(value) if tx.handle.finished().await => Ok(value),
                Ok(value) => tx.commit().await.map(|()| value),
                Err(err) => {
                    if !tx.handle.0.state.lock().await.ended {
                        let _ = tx.rollback().await;
                    }
                    Err(err)
                }
            };
            let err = match outcome {
                // A COMMIT whose outcome is unknown may have committed: never run again.
                Err(err)
                    if err.is_transaction_lost()
                        && !err.is_outcome_unknown()
                        && run < policy.max_attempts =>
                {
                    err
                }
                other => return other,
            };
            let delay = {
                let mut rng = transport
                    .rng
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                backoff::delay(&policy, run, &mut *rng)
            };
            if policy
                .max_elapsed
                .is_some_and(|limit| started.elapsed() + delay >= limit)
            {
                return Err(err);
            }
            if let Some(bucket) = &transport.budget
                && !bucket.withdraw(bucket.settings().retry_cost())
            {
                return Err(err
                    .with_budget_exhausted()
                    .with_retry_state(transport.retry_state()));
            }
            tracing::info!(run, error = %err, "the transaction was lost; running it again");
            tokio::time::sleep(delay).await;
        }
    }
}
