//! The registry of interactive transactions ([`Transactions`]): which open transaction a token
//! names and whose it is, each one's sequence of statements, its exactly-once commit, its
//! bounds, and the outcomes of finished ones.
//!
//! - **Tokens** are `<instance>.<128 random bits>` in hex: `instance` names the process that
//!   holds the transaction (drawn at start), so a server that does not know a token can tell
//!   one of its own that never existed (`404`) from another server's or an earlier run's (whose
//!   commit record it reads; nothing recorded means nothing committed: `TRANSACTION_EXPIRED`).
//!   A token is bound to the credential that opened it: any other one gets `404`.
//! - **Statements** carry their sequence number: the next one runs, the last one is answered
//!   from its stored result (a re-send after a lost answer), any other is
//!   `TRANSACTION_STEP_OUT_OF_ORDER`. Only the last statement's result is kept (within
//!   `--max-result-bytes`, held against the server's budget). A failure that depends on load
//!   (a timeout, `503`) is not stored and does not advance the sequence: the statement was
//!   undone, and its re-send runs it again.
//! - **Commit** stores the transaction's outcome with its effects through the engine (see
//!   [`Record`]); a re-sent COMMIT, and the outcome endpoint, answer from the finished outcomes
//!   (kept for the idempotency TTL in memory, and the commit record in the database).
//! - **Bounds**: `--max-transactions` open at once (`503` past it), an idle timeout and a
//!   lifetime cap (then rolled back: `TRANSACTION_EXPIRED`), checked when a transaction is
//!   used and by a reaper task.
//! - **A share per credential** ([`Owners`]): one owner may hold at most half of the open
//!   transactions (`max(1, --max-transactions / 2)`) and half of the part of the budget
//!   stored results may take (at least one result's limit), so one credential can never take
//!   them all from the others. Finished outcomes are a fair share per owner too
//!   (`engine::outcomes`).
//! - **Answers are shared, not copied**: the stored result is one buffer ([`Bytes`]) holding
//!   its shares of the budget; its answer and every replay of it send that buffer and hold
//!   those shares until they are sent ([`Answer`]), so unread replays cost nothing more and
//!   what they keep alive stays counted.
//!
//! Each statement and commit runs as a task of its own: a client that goes away mid-statement
//! does not cut it short, so its re-send finds the stored result. Knows the engine contract and
//! the protocol's error codes; nothing about HTTP or either engine's SQL.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::budget::{Budget, Held};
use crate::config::TransactionLimits;
use crate::engine::interactive::{CommitError, Record, Session, StepError, TxOptions};
use crate::engine::keyed::millis;
use crate::engine::outcomes::Finished;
use crate::engine::{Backend, Engine as _, Outcome};
use crate::protocol::bookmark::{Position, ReadAt, ServedBy};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use sqlhttp_protocol::body::{Outcome as TxOutcome, TransactionOpened, TransactionOutcome};

/// How long finished outcomes are kept in memory when the server keeps no idempotency keys.
const KEPT_WITHOUT_TTL: Duration = Duration::from_secs(300);

/// The most finished outcomes kept in memory, all owners together: past it, the oldest of the
/// owner that holds the most goes first (see `engine::outcomes`).
const MAX_FINISHED: usize = 65_536;

/// How long after a COMMIT's answer from the database was lost its outcome stays "unknown"
/// when no commit record is found: the session that ran it is cancelled and terminated when
/// the answer is lost (within the engine's connect limit, 5 s), and until it is gone the COMMIT
/// may still land, record and all. Past this, no record means it did not commit.
const UNKNOWN_SETTLES: Duration = Duration::from_secs(10);

/// The longest error message a finished outcome keeps (a trigger's `RAISE` may carry
/// megabytes): the rest is cut, so what the registry holds of finished transactions is bounded
/// by bytes as well as by count. A finished outcome costs about 1 KiB with this (measured: the
/// registry's memory levels off near 70 MiB once [`MAX_FINISHED`] are kept).
const MAX_KEPT_MESSAGE: usize = 512;

/// How a transaction ended, as later requests for it are answered.
#[derive(Debug, Clone)]
enum Ending {
    /// Committed: the COMMIT's answer body (small: the server writes it), and where the
    /// commit stands in the log (the COMMIT's own bookmark, or a position read after its
    /// record was found), so every answer that reports it carries a bookmark at or past it.
    Committed(Bytes, Option<Position>),
    /// Its COMMIT failed and it was rolled back: the COMMIT's error.
    Refused(ApiError),
    /// Its client rolled it back.
    RolledBack,
    /// The server rolled it back (idle, too old, shut down).
    Expired,
    /// It could not go on (serialization failure, deadlock, lost connection).
    Aborted(ApiError),
    /// Its COMMIT's answer from the database was lost (at this instant): the commit record
    /// tells, once the COMMIT cannot be in flight any more (see [`UNKNOWN_SETTLES`]).
    Unknown(Instant),
}

impl Ending {
    fn name(&self) -> TxOutcome {
        match self {
            Ending::Committed(..) => TxOutcome::Committed,
            Ending::Refused(_) | Ending::RolledBack => TxOutcome::RolledBack,
            Ending::Expired => TxOutcome::Expired,
            Ending::Aborted(_) => TxOutcome::Aborted,
            Ending::Unknown(_) => TxOutcome::Unknown,
        }
    }
}

/// What a request asks of a transaction that has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Step,
    Commit,
    Rollback,
    Outcome,
}

/// The transaction's state, one request at a time.
struct Live {
    /// `None` once it ended.
    session: Option<Session>,
    /// The sequence number of the last statement run (0 before the first).
    seq: u64,
    /// The last statement's answer, for its re-send.
    last: Option<Kept>,
    last_used: Instant,
}

/// The last statement's answer, kept for its re-send: the statement it answered (a digest of
/// its text and parameters: a re-send under the same number must be the same statement), and
/// its shares of the server's budget, of the part of it transactions may hold, and of its
/// owner's part of that: held by the kept answer and by every answer that sends it, until the
/// last of them is done.
struct Kept {
    status: u16,
    body: Bytes,
    statement: [u8; 32],
    held: Arc<Held>,
}

impl Kept {
    /// An answer that sends the kept body (shared, not copied), holding its shares.
    fn answer(&self, replayed: bool) -> Answer {
        Answer {
            status: self.status,
            body: self.body.clone(),
            replayed,
            position: None,
            held: Held::sharing(&self.held),
        }
    }
}

/// A request's answer from the registry: a status and JSON body, with the shares of the
/// server's budget the body holds until it has been sent (a stored result's, shared by each
/// of its answers; nothing for the small answers the registry writes itself).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Bytes,
    pub(crate) replayed: bool,
    /// Where the answer stands (`Sqlhttp-Bookmark`), when it is known.
    pub(crate) position: Option<Position>,
    pub(crate) held: Held,
}

impl From<Outcome> for Answer {
    fn from(outcome: Outcome) -> Answer {
        Answer {
            status: outcome.status,
            body: Bytes::from(outcome.body),
            replayed: outcome.replayed,
            position: outcome.position,
            held: Held::default(),
        }
    }
}

/// Each owner's share of the transactions (see the module's doc), by owner: credentials are
/// the operator's, so there are as many entries as credentials that ever opened one.
struct Owners {
    /// The most transactions one owner may hold open.
    max_open: usize,
    /// The most of the stored results' part of the budget one owner's may hold.
    result_bytes: usize,
    by_owner: Mutex<HashMap<String, Arc<OwnerShare>>>,
}

/// One owner's share: its open transactions and its part of the stored results' budget.
struct OwnerShare {
    open: AtomicUsize,
    results: Budget,
}

/// One of an owner's open-transaction places, given back when its transaction's entry goes.
struct OwnerSlot(Arc<OwnerShare>);

impl Drop for OwnerSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Owners {
    fn new(max_open: usize, share_bytes: usize, max_result_bytes: usize) -> Owners {
        Owners {
            max_open: (max_open / 2).max(1),
            result_bytes: (share_bytes / 2).max(max_result_bytes.min(share_bytes)),
            by_owner: Mutex::new(HashMap::new()),
        }
    }

    fn share(&self, owner: &str) -> Arc<OwnerShare> {
        Arc::clone(
            lock(&self.by_owner)
                .entry(owner.to_owned())
                .or_insert_with(|| {
                    Arc::new(OwnerShare {
                        open: AtomicUsize::new(0),
                        results: Budget::new(self.result_bytes),
                    })
                }),
        )
    }

    /// A place for one more open transaction of `owner`, or `503` when it holds its share.
    fn open(&self, owner: &str) -> Result<OwnerSlot, ApiError> {
        let share = self.share(owner);
        share
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max_open).then_some(open + 1)
            })
            .map_err(|_| {
                ApiError::unavailable(format!(
                    "this credential holds as many open transactions as one credential may ({}, \
                     half of --max-transactions, so that others always have their share); \
                     commit or roll one back, or retry later",
                    self.max_open
                ))
            })?;
        Ok(OwnerSlot(share))
    }
}

/// What a statement is, for [`Kept::statement`].
fn statement_digest(request: &SqlRequest) -> [u8; 32] {
    Sha256::new()
        .chain_update(request.sql.as_bytes())
        .chain_update(b"\n")
        .chain_update(format!("{:?}", request.params))
        .finalize()
        .into()
}

/// `err` with its message cut to [`MAX_KEPT_MESSAGE`] bytes, for a finished outcome.
fn bounded(mut err: ApiError) -> ApiError {
    if err.message.len() > MAX_KEPT_MESSAGE {
        let mut end = MAX_KEPT_MESSAGE;
        while !err.message.is_char_boundary(end) {
            end -= 1;
        }
        err.message.truncate(end);
        err.message.push_str(" ... (cut)");
    }
    err
}

/// One open transaction.
struct Entry {
    token: String,
    owner: String,
    options: TxOptions,
    opened_at: Instant,
    /// The Idempotency-Key it was opened under, if any.
    open_key: Option<String>,
    /// Its open's answer, for a re-sent open, with the snapshot's position when it has one.
    opened: Vec<u8>,
    opened_at_position: Option<Position>,
    state: Arc<tokio::sync::Mutex<Live>>,
    /// Its place among its owner's open transactions.
    owner_share: OwnerSlot,
    _permit: OwnedSemaphorePermit,
}

/// The token an open under one key opened, `None` while it runs (or after it failed).
type OpenSlot = Arc<tokio::sync::Mutex<Option<String>>>;

/// Removes an open's slot from the registry when the open ends without a transaction: it
/// failed, or its future was dropped (the client went away mid-open).
struct OpenGuard<'a> {
    opens: &'a Mutex<HashMap<(String, String), OpenSlot>>,
    key: (String, String),
    slot: OpenSlot,
    armed: bool,
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut opens = lock(self.opens);
        if opens
            .get(&self.key)
            .is_some_and(|slot| Arc::ptr_eq(slot, &self.slot))
        {
            opens.remove(&self.key);
        }
    }
}

/// Counts for the metrics.
#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    rollbacks: AtomicU64,
    expirations: AtomicU64,
    aborts: AtomicU64,
}

/// Transaction counts for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TransactionCounts {
    /// Open now.
    pub(crate) open: usize,
    /// Committed since the start.
    pub(crate) commits: u64,
    /// Rolled back by their clients (or by a failed COMMIT) since the start.
    pub(crate) rollbacks: u64,
    /// Rolled back by the server (idle, too old, shutdown) since the start.
    pub(crate) expirations: u64,
    /// Aborted (serialization failure, deadlock, lost connection) since the start.
    pub(crate) aborts: u64,
}

/// The registry of interactive transactions.
pub(crate) struct Transactions {
    limits: TransactionLimits,
    ttl: Option<Duration>,
    max_result_bytes: usize,
    budget: Budget,
    /// The part of `budget` transactions' stored results may hold together (half of it), so
    /// transactions that are open, whatever they run, always leave the rest to plain
    /// requests, keyed ones and batches.
    share: Budget,
    /// Each owner's share of the open transactions and of `share`.
    owners: Owners,
    instance: String,
    slots: Arc<Semaphore>,
    live: Mutex<HashMap<String, Arc<Entry>>>,
    /// Each `(owner, Idempotency-Key)` an open came with, and the token it opened: a re-sent
    /// open waits here for the first one and answers its transaction.
    opens: Mutex<HashMap<(String, String), OpenSlot>>,
    /// How finished transactions ended, a share per owner (see `engine::outcomes`).
    finished: Mutex<Finished<Ending>>,
    counters: Counters,
    reaper: AtomicBool,
    /// The server is shutting down: no transaction opens any more.
    closed: AtomicBool,
}

impl std::fmt::Debug for Transactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactions")
            .field("limits", &self.limits)
            .field("open", &lock(&self.live).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `{"outcome":"committed","stats":{...}}`: a commit's answer, with what its COMMIT took.
fn committed_body(took: std::time::Duration) -> Vec<u8> {
    let mut body = br#"{"outcome":"committed""#.to_vec();
    crate::protocol::result::stats(&mut body, took, None, None, ServedBy::Primary);
    body.push(b'}');
    body
}

/// `{"outcome": name}`: the protocol's `TransactionOutcome`.
pub(crate) fn outcome_body(outcome: TxOutcome) -> Vec<u8> {
    // Serializing one enum into a Vec cannot fail.
    serde_json::to_vec(&TransactionOutcome {
        outcome,
        stats: None,
    })
    .unwrap_or_default()
}

/// The answer for a transaction the server rolled back.
pub(crate) fn expired() -> ApiError {
    ApiError::new(
        ErrorCode::TransactionExpired,
        "the transaction expired and was rolled back by the server (it was idle too long, open \
         too long, or its server restarted or is another one); nothing of it was committed",
    )
}

fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such transaction")
}

fn finished(how: &str) -> ApiError {
    ApiError::new(
        ErrorCode::TransactionFinished,
        format!("the transaction has ended ({how}); nothing more runs in it"),
    )
}

/// The commit record's key in the idempotency store: a space keeps it apart from every
/// Idempotency-Key a client can send (visible ASCII only).
fn record_key(token: &str) -> String {
    format!("sqlhttp transaction {token}")
}

/// A tombstone's identity: "nothing of `token` committed", said by a server that answered for
/// it (no owner's record hash is this).
fn tombstone_hash(token: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(b"sqlhttp transaction tombstone\n")
        .chain_update(token)
        .finalize()
        .into()
}

/// The commit record's identity: the owner's, so another credential's lookup finds nothing.
fn record_hash(owner: &str, token: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(b"sqlhttp transaction\n")
        .chain_update(owner)
        .chain_update(b"\n")
        .chain_update(token)
        .finalize()
        .into()
}

impl Transactions {
    /// An empty registry under `limits`; finished outcomes and commit records are kept for
    /// `ttl` (the idempotency TTL; without one, commits are not recorded in the database).
    pub(crate) fn new(
        limits: TransactionLimits,
        ttl: Option<Duration>,
        max_result_bytes: usize,
        budget: Budget,
    ) -> Transactions {
        Transactions {
            limits,
            ttl,
            max_result_bytes,
            share: Budget::new(budget.bytes() / 2),
            owners: Owners::new(limits.max_open, budget.bytes() / 2, max_result_bytes),
            budget,
            instance: format!("{:08x}", rand::random::<u32>()),
            slots: Arc::new(Semaphore::new(limits.max_open)),
            live: Mutex::new(HashMap::new()),
            opens: Mutex::new(HashMap::new()),
            finished: Mutex::new(Finished::new(MAX_FINISHED, ttl.unwrap_or(KEPT_WITHOUT_TTL))),
            counters: Counters::default(),
            reaper: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// This process's instance: the first part of its tokens.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// The instance that holds `token`, when that is another process: this one neither holds
    /// it nor knows how it ended (the request may be forwarded there: `http::peers`).
    pub(crate) fn held_elsewhere<'t>(&self, token: &'t str) -> Option<&'t str> {
        let instance = token.split('.').next()?;
        let elsewhere = instance != self.instance
            && !lock(&self.live).contains_key(token)
            && !lock(&self.finished).contains(token);
        elsewhere.then_some(instance)
    }

    /// The counts for the metrics.
    pub(crate) fn counts(&self) -> TransactionCounts {
        TransactionCounts {
            open: lock(&self.live).len(),
            commits: self.counters.commits.load(Ordering::Relaxed),
            rollbacks: self.counters.rollbacks.load(Ordering::Relaxed),
            expirations: self.counters.expirations.load(Ordering::Relaxed),
            aborts: self.counters.aborts.load(Ordering::Relaxed),
        }
    }

    /// Opens a transaction for `owner` with `options`; a re-sent open under the same `key`
    /// answers the same transaction while it is open.
    pub(crate) async fn open(
        self: &Arc<Self>,
        engine: &Backend,
        owner: &str,
        key: Option<String>,
        options: TxOptions,
        at: ReadAt,
    ) -> Result<Outcome, ApiError> {
        if self.limits.max_open == 0 {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                "this server does not offer interactive transactions (--max-transactions 0)",
            ));
        }
        let options = options.check()?;
        if self.closed.load(Ordering::Acquire) {
            return Err(crate::engine::shutting_down());
        }
        self.start_reaper();
        let Some(key) = key else {
            return self
                .open_now(engine, owner, None, options, at)
                .await
                .map(|(_, outcome)| outcome);
        };
        let slot_key = (owner.to_owned(), key.clone());
        let slot = Arc::clone(lock(&self.opens).entry(slot_key.clone()).or_default());
        // A re-sent open waits for the first one with its key, then answers its transaction.
        let mut claim = Arc::clone(&slot).lock_owned().await;
        if let Some(entry) = claim
            .as_ref()
            .and_then(|token| lock(&self.live).get(token).cloned())
        {
            if entry.options != options {
                return Err(ApiError::new(
                    ErrorCode::IdempotencyKeyReused,
                    "this Idempotency-Key opened a transaction with other options (read_only, \
                     isolation, deferrable): a re-sent open must ask for the same; use a new key \
                     for another transaction",
                ));
            }
            return Ok(Outcome {
                status: 200,
                body: entry.opened.clone(),
                replayed: true,
                position: entry.opened_at_position,
            });
        }
        // Until this open has a transaction, the slot goes with it, however it ends (an error,
        // or its client gone mid-open, which drops this future): nothing of a cut open stays.
        let mut guard = OpenGuard {
            opens: &self.opens,
            key: slot_key,
            slot: Arc::clone(&slot),
            armed: true,
        };
        let opened = self.open_now(engine, owner, Some(key), options, at).await;
        if let Ok((token, _)) = &opened {
            // The transaction's end removes the slot (see `finish`).
            *claim = Some(token.clone());
            guard.armed = false;
        }
        opened.map(|(_, outcome)| outcome)
    }

    /// Opens a transaction on the engine and registers it: its token and the open's answer.
    async fn open_now(
        self: &Arc<Self>,
        engine: &Backend,
        owner: &str,
        key: Option<String>,
        options: TxOptions,
        at: ReadAt,
    ) -> Result<(String, Outcome), ApiError> {
        let owner_share = self.owners.open(owner)?;
        let permit = Arc::clone(&self.slots).try_acquire_owned().map_err(|_| {
            ApiError::unavailable(format!(
                "the server holds as many open transactions as it allows ({}, \
                 --max-transactions); retry later",
                self.limits.max_open
            ))
        })?;
        let session = engine.begin(options, at).await?;
        let position = session.position();
        if self.closed.load(Ordering::Acquire) {
            session.rollback().await;
            return Err(crate::engine::shutting_down());
        }
        let token = format!("{}.{:032x}", self.instance, rand::random::<u128>());
        let opened = serde_json::to_vec(&TransactionOpened {
            transaction: token.as_str(),
            read_only: options.read_only,
            isolation: options.isolation,
            idle_timeout_ms: millis(self.limits.idle_timeout).unsigned_abs(),
            max_lifetime_ms: millis(self.limits.max_lifetime).unsigned_abs(),
        })
        .map_err(|_| ApiError::internal())?;
        let now = Instant::now();
        let entry = Arc::new(Entry {
            token: token.clone(),
            owner: owner.to_owned(),
            options,
            opened_at: now,
            open_key: key,
            opened: opened.clone(),
            opened_at_position: position,
            state: Arc::new(tokio::sync::Mutex::new(Live {
                session: Some(session),
                seq: 0,
                last: None,
                last_used: now,
            })),
            owner_share,
            _permit: permit,
        });
        lock(&self.live).insert(token.clone(), entry);
        Ok((token, Outcome::fresh(opened).at(position)))
    }

    /// Runs statement `seq` of the transaction `token`.
    pub(crate) async fn step(
        self: &Arc<Self>,
        engine: &Backend,
        owner: &str,
        token: &str,
        seq: u64,
        request: SqlRequest,
    ) -> Result<Answer, ApiError> {
        self.on_open(
            engine,
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
        engine: &Backend,
        owner: &str,
        token: &str,
    ) -> Result<Answer, ApiError> {
        self.on_open(
            engine,
            owner,
            token,
            Op::Commit,
            |registry, entry, mut live| async move {
                let Some(session) = live.session.take() else {
                    return Err(expired());
                };
                live.last = None;
                let body = outcome_body(TxOutcome::Committed);
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
                        let body = Bytes::from(committed_body(began.elapsed()));
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
        engine: &Backend,
        owner: &str,
        token: &str,
    ) -> Result<Answer, ApiError> {
        self.on_open(
            engine,
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
                Ok(Outcome::fresh(outcome_body(TxOutcome::RolledBack)).into())
            },
        )
        .await
    }

    /// Runs `work` on the open transaction `token` of `owner`, as a task of its own (a client
    /// that goes away mid-way does not cut it short, so its re-send finds what it did), with
    /// the transaction's state locked and its session there. A transaction that is not open
    /// here, or that expired or ended meanwhile, is answered by how it ended, as `op` is.
    async fn on_open<F, Fut>(
        self: &Arc<Self>,
        engine: &Backend,
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
            return self.ended(engine, owner, token, op).await.map(Answer::from);
        };
        let registry = Arc::clone(self);
        let task = tokio::spawn(async move {
            let mut live = Arc::clone(&entry.state).lock_owned().await;
            if registry.expire_if_due(&entry, &mut live) {
                return answer(op, &Ending::Expired).map(Answer::from);
            }
            if live.session.is_none() {
                drop(live);
                let ending = registry.ending_of(&entry.token).unwrap_or(Ending::Expired);
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
        engine: &Backend,
        owner: &str,
        token: &str,
    ) -> Result<Answer, ApiError> {
        if self.find(owner, token).is_some() {
            return Ok(Outcome::fresh(outcome_body(TxOutcome::Open)).into());
        }
        self.ended(engine, owner, token, Op::Outcome)
            .await
            .map(Answer::from)
    }

    /// Rolls back every open transaction and opens no more (the server is shutting down).
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.expire_all().await;
    }

    /// Rolls back every open transaction (each running statement or COMMIT finishes first):
    /// later requests for them are `410 TRANSACTION_EXPIRED`.
    pub(crate) async fn expire_all(&self) {
        let entries: Vec<Arc<Entry>> = lock(&self.live).values().cloned().collect();
        for entry in entries {
            let mut live = entry.state.lock().await;
            if let Some(session) = live.session.take() {
                live.last = None;
                session.rollback().await;
                self.finish(&entry, Ending::Expired);
            }
        }
    }

    /// The open transaction `token` if `owner` holds it.
    fn find(&self, owner: &str, token: &str) -> Option<Arc<Entry>> {
        lock(&self.live)
            .get(token)
            .filter(|entry| entry.owner == owner)
            .cloned()
    }

    /// Answers a request for a transaction that is not open here: from the finished outcomes,
    /// or, for another server's (or an earlier run's) token, from its commit record.
    async fn ended(
        &self,
        engine: &Backend,
        owner: &str,
        token: &str,
        op: Op,
    ) -> Result<Outcome, ApiError> {
        let known = {
            let finished = lock(&self.finished);
            finished
                .get(token)
                .map(|(whose, ending)| (whose == owner).then(|| ending.clone()))
        };
        let ending = match known {
            Some(None) => return Err(not_found()),
            Some(Some(Ending::Unknown(since))) => {
                // Once the COMMIT cannot be in flight any more, "not committed" is made final.
                let settled = since.elapsed() >= UNKNOWN_SETTLES;
                match self.read_record(engine, owner, token, settled).await? {
                    committed @ Ending::Committed(..) => committed,
                    // The COMMIT whose answer was lost may still be finishing on the database
                    // (its session is being ended): no record yet is not "never committed".
                    _ if since.elapsed() < UNKNOWN_SETTLES => Ending::Unknown(since),
                    not_committed => not_committed,
                }
            }
            Some(Some(ending)) => ending,
            // One of this server's own that it no longer remembers (past the cap of finished
            // outcomes): committed if its record says so, else never one it issued.
            None if token.split('.').next() == Some(self.instance.as_str()) => {
                match self.read_record(engine, owner, token, false).await? {
                    committed @ Ending::Committed(..) => committed,
                    _ => return Err(not_found()),
                }
            }
            // Another process's (or one from before a restart): "nothing committed" is made
            // final before it is said, so its holder, if alive, can never commit it after.
            None => self.read_record(engine, owner, token, true).await?,
        };
        answer(op, &ending)
    }

    /// The commit record of `token`: committed, or (nothing recorded) expired. With `fence`,
    /// "expired" is made final first: a tombstone claims the record's key (unless the record
    /// is there), so a COMMIT its holder still runs finds it and rolls back (see
    /// `interactive::fenced`); whichever claims the key first is the answer.
    async fn read_record(
        &self,
        engine: &Backend,
        owner: &str,
        token: &str,
        fence: bool,
    ) -> Result<Ending, ApiError> {
        let Some(ttl) = self.ttl else {
            // Without the store, commits are not recorded: "nothing committed" would be a guess.
            return Err(ApiError::unavailable(
                "this server keeps no commit records (--no-idempotency), and it does not know how \
                 this transaction ended (another server's, or one from before a restart): whether \
                 it committed cannot be told here",
            ));
        };
        let mut stored = engine.recorded(record_key(token)).await?;
        if fence && stored.is_none() {
            stored = Some(
                engine
                    .claim_record(
                        record_key(token),
                        tombstone_hash(token),
                        410,
                        outcome_body(TxOutcome::Expired),
                    )
                    .await?,
            );
        }
        let fresh = |created_at: i64| {
            crate::engine::keyed::now_millis().saturating_sub(created_at) < millis(ttl)
        };
        Ok(match stored {
            Some(stored)
                if stored.request_hash == record_hash(owner, token) && fresh(stored.created_at) =>
            {
                // Read with the record: at or past the commit that made it visible.
                let position = stored.position.map(|bookmark| Position {
                    bookmark,
                    served_by: ServedBy::Primary,
                });
                let ending = Ending::Committed(Bytes::from(stored.body), position);
                self.remember(token, owner, ending.clone());
                ending
            }
            _ => Ending::Expired,
        })
    }

    fn ending_of(&self, token: &str) -> Option<Ending> {
        lock(&self.finished)
            .get(token)
            .map(|(_, ending)| ending.clone())
    }

    /// Rolls the transaction back if it was idle or open too long; `true` if it did.
    fn expire_if_due(self: &Arc<Self>, entry: &Arc<Entry>, live: &mut Live) -> bool {
        if live.session.is_none() {
            return false;
        }
        let now = Instant::now();
        let idle = now.saturating_duration_since(live.last_used) >= self.limits.idle_timeout;
        let old = now.saturating_duration_since(entry.opened_at) >= self.limits.max_lifetime;
        // The engine ended it on its own (ADR 0042): expired, as the registry's bounds do.
        let ended = live.session.as_ref().is_some_and(Session::must_end);
        if !(idle || old || ended) {
            return false;
        }
        if let Some(session) = live.session.take() {
            live.last = None;
            tokio::spawn(session.rollback());
        }
        tracing::debug!(
            idle,
            old,
            ended,
            "an interactive transaction expired; rolled back"
        );
        self.finish(entry, Ending::Expired);
        true
    }

    /// Moves `entry` from the open transactions to the finished ones.
    fn finish(&self, entry: &Entry, ending: Ending) {
        let counter = match &ending {
            Ending::Committed(..) => &self.counters.commits,
            Ending::Refused(_) | Ending::RolledBack => &self.counters.rollbacks,
            Ending::Expired => &self.counters.expirations,
            Ending::Aborted(_) | Ending::Unknown(_) => &self.counters.aborts,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            ending = ending.name().as_str(),
            "an interactive transaction ended"
        );
        lock(&self.live).remove(&entry.token);
        if let Some(key) = &entry.open_key {
            lock(&self.opens).remove(&(entry.owner.clone(), key.clone()));
        }
        self.remember(&entry.token, &entry.owner, ending);
    }

    /// Keeps how `token` ended, for the TTL, dropping what is older (or past the cap); an
    /// error is kept with its message cut to [`MAX_KEPT_MESSAGE`].
    fn remember(&self, token: &str, owner: &str, ending: Ending) {
        let ending = match ending {
            Ending::Refused(err) => Ending::Refused(bounded(err)),
            Ending::Aborted(err) => Ending::Aborted(bounded(err)),
            other => other,
        };
        lock(&self.finished).keep(token, owner, ending, Instant::now());
    }

    /// Starts the task that expires idle and old transactions, once (from the first open:
    /// the registry may be built outside a runtime).
    fn start_reaper(self: &Arc<Self>) {
        if self.reaper.swap(true, Ordering::AcqRel) {
            return;
        }
        let every = (self.limits.idle_timeout.min(self.limits.max_lifetime) / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let registry: Weak<Transactions> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                lock(&registry.finished).expire(Instant::now());
                let entries: Vec<Arc<Entry>> = lock(&registry.live).values().cloned().collect();
                for entry in entries {
                    // A transaction running a statement now is not idle.
                    if let Ok(mut live) = Arc::clone(&entry.state).try_lock_owned() {
                        registry.expire_if_due(&entry, &mut live);
                    }
                }
            }
        });
    }
}

/// How a request `op` for a transaction that ended as `ending` is answered.
fn answer(op: Op, ending: &Ending) -> Result<Outcome, ApiError> {
    let replayed = |body: Vec<u8>, position: Option<Position>| {
        Ok(Outcome {
            status: 200,
            body,
            replayed: true,
            position,
        })
    };
    match (op, ending) {
        (Op::Outcome, Ending::Committed(_, position)) => {
            Ok(Outcome::fresh(outcome_body(ending.name())).at(*position))
        }
        (Op::Outcome, ending) => Ok(Outcome::fresh(outcome_body(ending.name()))),
        // The committed answer is the server's own `{"outcome":"committed"}`: a few bytes.
        (Op::Commit, Ending::Committed(body, position)) => replayed(body.to_vec(), *position),
        (Op::Step, Ending::Committed(..)) => Err(finished(TxOutcome::Committed.as_str())),
        (Op::Rollback, Ending::Committed(..)) => {
            Err(finished("committed: it cannot be rolled back"))
        }
        (Op::Commit, Ending::Refused(err)) | (Op::Commit | Op::Step, Ending::Aborted(err)) => {
            Err(err.clone())
        }
        (Op::Step, Ending::Refused(_)) => Err(finished("rolled back at its COMMIT")),
        (Op::Commit | Op::Step, Ending::RolledBack) => Err(finished(
            "rolled back by its client; nothing of it was committed",
        )),
        (Op::Commit | Op::Step, Ending::Expired) => Err(expired()),
        (Op::Commit | Op::Step, Ending::Unknown(_)) => Err(ApiError::outcome_unknown(
            "whether the transaction committed is not known yet; send the COMMIT again (or ask \
             for its outcome) until it is",
        )),
        (Op::Rollback, ending) => replayed(outcome_body(ending.name()), None),
    }
}
