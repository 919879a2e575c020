//! Interactive transactions: [`TransactionBuilder`] (made by [`Client::transaction`]) opens a
//! [`Transaction`] on the server, whose statements ([`Transaction::query`],
//! [`Transaction::execute`]) run in it in order until [`Transaction::commit`] or
//! [`Transaction::rollback`]; [`Client::transact`] runs a closure in one and runs it again when
//! the transaction is lost before it commits.
//!
//! Every step is safe to send twice, so the transport retries each as the client's policy
//! allows: a statement carries its number in the transaction (the server answers a re-sent one
//! from its stored result), the open and the COMMIT carry an idempotency key (the server answers
//! a re-sent one with the same transaction, or the stored outcome). This module knows the
//! transaction endpoints' bodies and the order of steps; the retry rules are the transport's.
//!
//! Two rules keep a retry from reporting what did not happen. A statement whose outcome is
//! unknown after every retry (no answer, a gateway's `504`, `503 OUTCOME_UNKNOWN`) ends the
//! transaction: it is rolled back and its COMMIT is never sent, since the statement may or may
//! not be in it. A COMMIT whose outcome is unknown is settled by asking the server how the
//! transaction ended (`/outcome`), within the call's retry policy, before the SDK gives up.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::options::CallOptions;
use crate::retry::backoff;
use crate::retry::classify::OpClass;
use crate::statement::{RequestBody, ResponseFuture, Statement};
use crate::table::Table;
use crate::transport::{Call, Endpoint, TxStep};
use tokio::time::Instant;

/// A transaction's isolation level. SQLite's transactions are serializable only (the server
/// refuses the others there); PostgreSQL offers all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Isolation {
    /// As if the transactions ran one after another. On PostgreSQL one of two conflicting
    /// transactions then fails with [`ErrorKind::TransactionLost`], and [`Client::transact`]
    /// runs it again.
    #[default]
    Serializable,
    /// One snapshot for the whole transaction (PostgreSQL).
    RepeatableRead,
    /// Each statement sees what committed before it (PostgreSQL).
    ReadCommitted,
}

impl Isolation {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Isolation::Serializable => "serializable",
            Isolation::RepeatableRead => "repeatable_read",
            Isolation::ReadCommitted => "read_committed",
        }
    }
}

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

    /// Opens a read-only transaction: its statements see one snapshot and any that writes is
    /// refused ([`ErrorKind::ReadOnly`]). On SQLite it does not hold the write lock.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Opens the transaction at `isolation` (default [`Isolation::Serializable`]).
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// For a read-only serializable transaction: wait for a snapshot that can never fail to
    /// serialize (PostgreSQL's `DEFERRABLE`; every SQLite read is one).
    pub fn deferrable(mut self) -> Self {
        self.deferrable = true;
        self
    }

    async fn open(self) -> Result<Transaction> {
        #[derive(Serialize)]
        struct Open {
            read_only: bool,
            isolation: &'static str,
            deferrable: bool,
        }
        #[derive(Deserialize)]
        struct Opened {
            transaction: String,
        }
        let body = serde_json::to_vec(&Open {
            read_only: self.read_only,
            isolation: self.isolation.as_str(),
            deferrable: self.deferrable,
        })
        .map_err(Error::decode)?;
        let answer = send(&self.client, TxStep::Open, Bytes::from(body), "BEGIN").await?;
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
            shared: Arc::new(Shared {
                client: self.client,
                token: transaction,
                state: tokio::sync::Mutex::new(State::default()),
            }),
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

/// An open interactive transaction on the server: statements run in it in order
/// ([`query`](Self::query), [`execute`](Self::execute)) until [`commit`](Self::commit) or
/// [`rollback`](Self::rollback). Clones share the one transaction (for a closure of
/// [`Client::transact`]); its statements are sent one at a time.
///
/// **Retries.** Every step is retried as the client's [`RetryPolicy`](crate::RetryPolicy)
/// allows, whatever `retry_writes` says: the server answers a re-sent statement from its stored
/// result instead of running it again, and a re-sent COMMIT with its stored outcome. A
/// transaction that cannot go on fails with [`ErrorKind::TransactionLost`] (nothing of it was
/// committed): it expired on the server (idle longer than the server's
/// `--transaction-idle-timeout`, 10 s by default), failed to serialize, or deadlocked.
///
/// **A statement whose outcome is unknown** (every attempt timed out, lost its connection, or
/// was answered `504` by a gateway or `503 OUTCOME_UNKNOWN` by the server: its error's
/// [`Error::is_outcome_unknown`] is set) ends the transaction: the SDK rolls it back, and every
/// later statement and [`commit`](Self::commit) fails with [`ErrorKind::TransactionLost`]
/// without being sent. The statement may or may not be in the transaction, so committing it
/// would commit what the SDK reported as failed. A statement the server refused with a final
/// verdict (`SQL_ERROR`, `CONSTRAINT_VIOLATION`, `STATEMENT_NOT_ALLOWED`, `READ_ONLY`,
/// `STATEMENT_TIMEOUT`, `IDEMPOTENCY_KEY_REUSED`, ...) was undone, and the transaction goes on.
///
/// **Dropping** an uncommitted transaction rolls it back: in a background task when a tokio
/// runtime is at hand, else by the server's idle timeout. Until then, on SQLite, a write
/// transaction holds the database's write lock; commit or roll back promptly.
#[derive(Clone)]
pub struct Transaction {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    token: String,
    state: tokio::sync::Mutex<State>,
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
        runtime.spawn(async move {
            if let Err(err) = send(&client, TxStep::Rollback, body, "ROLLBACK").await {
                tracing::debug!(error = %err, "cannot roll back a dropped transaction; the server's idle timeout will");
            }
        });
    }
}

/// `{"transaction": token}` (a token is letters, digits and dots: checked at open).
fn named(token: &str) -> Bytes {
    Bytes::from(format!("{{\"transaction\":\"{token}\"}}"))
}

impl Transaction {
    /// A statement that reads in the transaction; bind its parameters, then fetch its rows
    /// ([`TxStatement::fetch_all`], ...) or await it for its [`Table`].
    pub fn query(&self, sql: impl Into<String>) -> TxStatement<'_> {
        TxStatement {
            tx: self,
            statement: Statement::new(sql.into()),
        }
    }

    /// A statement that writes in the transaction: the same as [`query`](Self::query) (every
    /// statement in a transaction is safe to retry); await it for its [`Table`]
    /// ([`Table::rows_affected`]).
    pub fn execute(&self, sql: impl Into<String>) -> TxStatement<'_> {
        self.query(sql)
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
    pub async fn commit(&self) -> Result<()> {
        let mut state = self.shared.state.lock().await;
        if state.ended {
            return Err(state.ended());
        }
        state.ended = true;
        let started = Instant::now();
        match self.send_commit(started).await {
            Ok(_) => Ok(()),
            Err(err) if commit_unsettled(&err) => self.settle(err, started).await,
            Err(err) => Err(err),
        }
    }

    /// Sends the COMMIT, under the call's limits counted from `started`.
    async fn send_commit(&self, started: Instant) -> Result<Vec<u8>> {
        send_since(
            &self.shared.client,
            TxStep::Commit,
            named(&self.shared.token),
            "COMMIT",
            Some(started),
        )
        .await
    }

    /// Asks the server how the transaction ended after a COMMIT whose outcome is unknown, until
    /// it knows or the retry policy, the budget or a cancellation allows no more; then the
    /// COMMIT's error, its outcome marked unknown.
    async fn settle(&self, err: Error, started: Instant) -> Result<()> {
        #[derive(Deserialize)]
        struct Answer {
            outcome: String,
        }
        let client = &self.shared.client;
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
                && !bucket.withdraw(false)
            {
                return Err(err.with_outcome_unknown().with_budget_exhausted());
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
                named(&self.shared.token),
                "OUTCOME",
                Some(started),
            )
            .await;
            let outcome = match answer {
                Ok(body) => match serde_json::from_slice::<Answer>(&body) {
                    Ok(Answer { outcome }) => outcome,
                    // Not an answer this version reads: ask again.
                    Err(_) => continue,
                },
                Err(asking) if asking.is_retryable() => continue,
                // The server cannot tell (it no longer knows the transaction, say), or the
                // client was cancelled.
                Err(_) => break,
            };
            tracing::debug!(asked, outcome = %outcome, "asked how the transaction ended");
            match outcome.as_str() {
                "committed" => return Ok(()),
                "rolled_back" | "aborted" => {
                    return Err(lost_at_commit(&err, "TRANSACTION_ABORTED", &outcome));
                }
                "expired" => return Err(lost_at_commit(&err, "TRANSACTION_EXPIRED", &outcome)),
                // No COMMIT reached it (a gateway answered for the server, say): it is still
                // open, so nothing of it committed, and the COMMIT asked for is sent again.
                "open" => match self.send_commit(started).await {
                    Ok(_) => return Ok(()),
                    Err(again) if commit_unsettled(&again) => {}
                    Err(again) => return Err(again),
                },
                // `unknown`, or an outcome this version does not know: not known yet.
                _ => {}
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
    pub async fn rollback(&self) -> Result<()> {
        self.end(TxStep::Rollback, "ROLLBACK").await
    }

    async fn end(&self, step: TxStep, sql: &str) -> Result<()> {
        let mut state = self.shared.state.lock().await;
        if state.ended {
            return Err(state.ended());
        }
        state.ended = true;
        send(&self.shared.client, step, named(&self.shared.token), sql)
            .await
            .map(drop)
    }

    /// Runs one statement as the next of the transaction.
    async fn run(&self, statement: Statement) -> Result<Table> {
        if let Some(kind) = statement.invalid() {
            return Err(Error::new(kind.clone()));
        }
        let mut state = self.shared.state.lock().await;
        if state.ended {
            return Err(state.ended());
        }
        let seq = state.seq + 1;
        let encoded = RequestBody {
            sql: statement.sql(),
            params: statement.params(),
            read_only: false,
        }
        .encode();
        // `{"sql": ...}` becomes `{"transaction": ..., "seq": n, "sql": ...}`.
        let mut body =
            format!("{{\"transaction\":\"{}\",\"seq\":{seq},", self.shared.token).into_bytes();
        body.extend_from_slice(&encoded[1..]);
        let sent = send(
            &self.shared.client,
            TxStep::Statement,
            Bytes::from(body),
            statement.sql(),
        )
        .await;
        match sent {
            Ok(answer) => {
                state.seq = seq;
                crate::wire::decode::table(&answer)
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
                        let code = err.code().unwrap_or("TRANSACTION_ABORTED");
                        state.lose(code, message);
                    }
                    Verdict::Unknown => {
                        // Whether it ran is unknown, so nothing more may follow it, and the
                        // transaction must never commit: it is rolled back.
                        state.lose(
                            "TRANSACTION_ABORTED",
                            format!(
                                "statement {seq} of this transaction has an unknown outcome \
                                 ({err}); the SDK rolled the transaction back, and nothing of it \
                                 was committed"
                            ),
                        );
                        drop(state);
                        if let Err(rollback) = send(
                            &self.shared.client,
                            TxStep::Rollback,
                            named(&self.shared.token),
                            "ROLLBACK",
                        )
                        .await
                        {
                            tracing::debug!(error = %rollback, "cannot roll back a transaction whose statement has an unknown outcome; the server's idle timeout will");
                        }
                    }
                }
                Err(err)
            }
        }
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
        ErrorKind::Sql { .. }
        | ErrorKind::ConstraintViolation { .. }
        | ErrorKind::StatementNotAllowed { .. } => Verdict::Stored,
        ErrorKind::ReadOnly { .. }
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
fn lost_at_commit(err: &Error, code: &str, outcome: &str) -> Error {
    let attempts = err.attempts();
    let history = err.history().to_vec();
    Error::new(ErrorKind::TransactionLost {
        code: code.to_owned(),
        message: format!(
            "the COMMIT's answer was lost, and the server says the transaction {}: nothing of \
             it was committed",
            match outcome {
                "rolled_back" => "was rolled back",
                "expired" => "expired",
                _ => "was aborted",
            }
        ),
    })
    .with_attempts(attempts, history)
    .with_sent(true, false)
}

/// A statement in a [`Transaction`]: bind its parameters, then fetch its rows, or await it
/// for its [`Table`].
#[must_use = "a statement does nothing until it is awaited"]
pub struct TxStatement<'t> {
    tx: &'t Transaction,
    statement: Statement,
}

impl fmt::Debug for TxStatement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxStatement")
            .field("sql", &self.statement.sql())
            .field("params", &self.statement.params().len())
            .finish_non_exhaustive()
    }
}

impl<'t> TxStatement<'t> {
    /// Binds the next positional parameter, as [`Query::bind`](crate::Query::bind) does.
    pub fn bind<T: Serialize>(mut self, value: T) -> Self {
        self.statement.bind(&value);
        self
    }

    /// Every row, each decoded into a `T` as [`Query::fetch_all`](crate::Query::fetch_all) does.
    ///
    /// # Errors
    ///
    /// The statement's failure (see [`Transaction`]); [`ErrorKind::Decode`] when a row is not a
    /// `T`.
    pub async fn fetch_all<T: DeserializeOwned>(self) -> Result<Vec<T>> {
        self.tx.run(self.statement).await?.rows_as()
    }

    /// The first row; [`ErrorKind::RowNotFound`] when there is none.
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all), and [`ErrorKind::RowNotFound`].
    pub async fn fetch_one<T: DeserializeOwned>(self) -> Result<T> {
        self.fetch_optional()
            .await?
            .ok_or_else(|| Error::new(ErrorKind::RowNotFound))
    }

    /// The first row, if any.
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all).
    pub async fn fetch_optional<T: DeserializeOwned>(self) -> Result<Option<T>> {
        Ok(self.fetch_all().await?.into_iter().next())
    }
}

impl<'t> IntoFuture for TxStatement<'t> {
    type Output = Result<Table>;
    type IntoFuture = ResponseFuture<'t, Table>;

    fn into_future(self) -> Self::IntoFuture {
        ResponseFuture::new(async move { self.tx.run(self.statement).await })
    }
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
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// client
    ///     .transact(|tx| async move {
    ///         let balance: i64 = tx
    ///             .query("SELECT balance FROM accounts WHERE id = ?").bind(1)
    ///             .fetch_one().await?;
    ///         tx.execute("UPDATE accounts SET balance = ? WHERE id = ?")
    ///             .bind(balance - 25).bind(1).await?;
    ///         tx.execute("UPDATE accounts SET balance = balance + 25 WHERE id = ?")
    ///             .bind(2).await?;
    ///         Ok(())
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
            let outcome = match work(tx.clone()).await {
                Ok(value) => tx.commit().await.map(|()| value),
                Err(err) => {
                    if !tx.shared.state.lock().await.ended {
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
                && !bucket.withdraw(false)
            {
                return Err(err.with_budget_exhausted());
            }
            tracing::info!(run, error = %err, "the transaction was lost; running it again");
            tokio::time::sleep(delay).await;
        }
    }
}
