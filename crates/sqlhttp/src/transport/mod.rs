//! The transport owns every HTTP exchange and every attempt: it sends one prepared request body to one
//! of the protocol's endpoints (a statement, or a batch), retries it as the operation's class and the
//! failure allow, waits between attempts, honours cancellation and the retry budget, and hands the
//! successful body to the call's receiver until it is served (the whole result, or a stream's first
//! row); the rest of the body is the caller's, never retried.
//!
//! It knows nothing of rows or SQL semantics: the `Client` methods encode requests and decode responses.
//! What a failed exchange *is* (its [`Failure`] and [`ErrorKind`]) comes from `response`, which this
//! module uses and which never uses it.
//! The rules it applies are documented in the [`retry`](crate::retry) module.
//!
//! This file is the attempt loop (what a [`Call`] is, how often and when it is sent, what a caller gets
//! back); one attempt's HTTP is in `exchange`, and the success body with the receiver seam in `body`.
//! It also keeps the client's bookmark session: each attempt carries the greatest bookmark known when
//! it is sent, and each success's bookmark (its header's, and the one its body names at its end
//! when the receiver has read that far) is merged before the caller sees the answer; a stream
//! merges its body's when it reaches the end. An attempt refused `409 BOOKMARK_AHEAD` drops the
//! session's bookmark and, except for an `execute`, is sent once more without it (nothing ran).

mod body;
pub(crate) mod exchange;
pub(crate) mod hedge;
pub(crate) mod metrics;
mod pace;
pub(crate) mod trace;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub(crate) use self::body::{Body, Receive};
pub(crate) use self::exchange::{AttemptRequest, Endpoint, Exchange, HttpExchange, TxStep};
use self::metrics::Metrics;
use self::trace::{Decision, TraceSettings};
use crate::bookmark::Session;
use crate::error::{AttemptFailure, Error, ErrorKind, Result};
use crate::options::CallOptions;
use crate::response::Failure;
use crate::retry::classify::{OpClass, is_transient, should_retry};
use crate::retry::cost::delay_before_retry;
use crate::retry::rate::AdaptiveRate;
use crate::retry::{RetryPolicy, TokenBucket};

/// Everything the transport needs, fixed when the client is built.
pub(crate) struct Transport {
    pub(crate) exchange: Box<dyn Exchange>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) policy: RetryPolicy,
    pub(crate) retry_writes: bool,
    pub(crate) budget: Option<TokenBucket>,
    /// The adaptive send rate, when the client turned it on (shared by clones, as the budget).
    pub(crate) rate: Option<AdaptiveRate>,
    /// Hedged reads: the client's policy, recent read latencies and the hedge budget.
    pub(crate) hedging: hedge::Hedging,
    pub(crate) rng: Mutex<StdRng>,
    pub(crate) cancel: Option<CancellationToken>,
    /// The greatest bookmark any answer to this client (or a clone) carried; shared with the
    /// streams still reading a body (which may name one at its end).
    pub(crate) session: Arc<Session>,
    /// What the call and attempt spans say about the client (`trace`).
    pub(crate) trace: TraceSettings,
    /// The `opentelemetry` feature's instruments (nothing without it).
    pub(crate) metrics: Metrics,
}

/// One call: a request body sent as many times as the rules allow. The request builders (statement,
/// batch, insert, describe) fill it in by name and hand it to `Client::send`, which checks its
/// options and passes it here.
pub(crate) struct Call<'a> {
    /// What the call may do, which decides what is retried: a read as the policy allows, a write
    /// only under `retry_writes` (always with an idempotency key), an execute never.
    pub(crate) class: OpClass,
    /// Where the body goes.
    pub(crate) endpoint: Endpoint,
    /// The encoded request body, sent unchanged on every attempt.
    pub(crate) body: Bytes,
    /// For debug-level logs only.
    pub(crate) sql: &'a str,
    /// The call's overrides of the client's settings (its idempotency key is the insert's business:
    /// see `idempotency_key` below).
    pub(crate) options: &'a CallOptions,
    /// The key to send on every attempt of a write; `None` makes one for the call. Not sent on a read
    /// or an execute.
    pub(crate) idempotency_key: Option<HeaderValue>,
    /// When the caller's operation began, if before this call (a bulk insert's later statements share
    /// its `max_elapsed`); `None` means now.
    pub(crate) started: Option<Instant>,
}

/// A successful call: the rest of the body (what the receiver has not taken), how many attempts it
/// took with what each failed one met, and how long the rest of the body may stall.
#[derive(Debug)]
pub(crate) struct Delivered {
    pub(crate) body: Body,
    pub(crate) attempts: u32,
    pub(crate) history: Vec<AttemptFailure>,
    /// The call's `timeout`: the longest wait for each further piece of the body.
    pub(crate) stall: Option<Duration>,
    /// The call's and the client's cancellation tokens, which end the rest of the body too.
    pub(crate) cancel: [Option<CancellationToken>; 2],
    /// The client's bookmark session, for a bookmark the rest of the body names at its end.
    pub(crate) session: Arc<Session>,
    /// Whether the call may write (any class but a read): a body it ends with
    /// `OUTCOME_UNKNOWN` leaves the write's outcome unknown.
    pub(crate) may_write: bool,
}

impl Delivered {
    /// Gives an error raised after the exchange (decoding, no row) the call's attempt count and history.
    pub(crate) fn attach(&self, err: Error) -> Error {
        err.with_attempts(self.attempts, self.history.clone())
            .with_sent(true, false)
    }
}

impl Transport {
    pub(crate) fn new_rng(seed: Option<u64>) -> StdRng {
        match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        }
    }

    /// Sends the call, retrying as allowed until `receiver` has what it needs from a response; returns
    /// the rest of that response's body, or the last failure with the attempt count and history.
    pub(crate) async fn send(
        &self,
        call: Call<'_>,
        receiver: &mut dyn Receive,
    ) -> Result<Delivered> {
        let span = trace::call_span(&self.trace, call.class, call.sql);
        let sql = call.sql;
        let started = Instant::now();
        let outcome = self
            .run(call, receiver, &span)
            .instrument(span.clone())
            .await;
        // The answer's header is looked up only for a span or metrics that take it.
        let engine = || outcome.as_ref().ok().and_then(|d| d.body.engine());
        if !span.is_disabled() {
            trace::record_engine(&span, engine());
            trace::end_call(&span, &outcome);
        }
        self.metrics.call_ended(
            started,
            sql,
            engine,
            outcome.as_ref().err().map(Error::kind),
            || self.retry_state(),
        );
        outcome
    }

    /// One attempt: the response head within the attempt's budget, then the body's pieces, each
    /// within the budget again (a stall, not the whole download), until `receiver` is served.
    async fn attempt(
        &self,
        request: AttemptRequest<'_>,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
        hedge: Option<hedge::Plan>,
        receiver: &mut dyn Receive,
    ) -> Result<Body, Failure> {
        receiver.reset();
        // An unhedged attempt is the exchange's own future, without the hedge's state around it.
        let exchange: exchange::ExchangeFuture<'_> = match hedge {
            None => self.exchange.send(request),
            plan => Box::pin(hedge::send(&*self.exchange, &self.hedging, request, plan)),
        };
        let mut body = with_timeout(attempt_budget(timeout, deadline), exchange).await?;
        loop {
            let piece = with_timeout(attempt_budget(timeout, deadline), body.chunk()).await?;
            let ended = piece.is_none();
            if receiver.take(piece.as_deref())? || ended {
                return Ok(body);
            }
        }
    }

    async fn run(
        &self,
        call: Call<'_>,
        receiver: &mut dyn Receive,
        span: &tracing::Span,
    ) -> Result<Delivered> {
        // The statement's text only when the application opted in: a tracing-opentelemetry layer
        // exports this event with the call's span, whatever the level it is logged at.
        if self.trace.query_text {
            tracing::debug!(sql = call.sql, "sending statement");
        } else {
            tracing::debug!("sending statement");
        }
        let options = call.options;
        let cancel = options.cancel.as_ref();
        // Per-call settings win over the client's.
        let timeout = options.timeout.unwrap_or(self.timeout);
        let policy = options.retry.unwrap_or(self.policy);
        let retry_writes = options.retry_writes.unwrap_or(self.retry_writes);
        let consistency = options.consistency.unwrap_or_default();
        let hedge = self.hedging.plan(call.class, call.endpoint, options.hedge);
        // A per-call policy with a seed of its own draws from its own source, so its delays repeat.
        let mut call_rng = options
            .retry
            .and_then(|policy| policy.seed)
            .map(|seed| Transport::new_rng(Some(seed)));
        let started = call.started.unwrap_or_else(Instant::now);
        // A ceiling too far to represent is no ceiling.
        let deadline = policy
            .max_elapsed
            .and_then(|limit| started.checked_add(limit));
        let mut max_attempts = match call.class {
            OpClass::Read | OpClass::Step => policy.max_attempts,
            OpClass::Write if retry_writes => policy.max_attempts,
            OpClass::Write | OpClass::Execute => 1,
        };
        let idempotency_key = match call.class {
            OpClass::Write | OpClass::Step => Some(call.idempotency_key.unwrap_or_else(|| {
                HeaderValue::try_from(new_idempotency_key()).expect("hex is a valid header value")
            })),
            OpClass::Read | OpClass::Execute => None,
        };
        let mut history: Vec<AttemptFailure> = Vec::new();
        let mut attempt = 0;
        // Whether an attempt may have reached the server, and whether one did so without an answer
        // that settles the statement's outcome.
        let mut sent = false;
        let mut unsettled = false;
        // Set once an attempt was refused `409 BOOKMARK_AHEAD`: later attempts carry no bookmark
        // of the call's own, and no second free attempt is made.
        let mut bookmark_refused = false;
        // The wait before the next attempt, for its span.
        let mut waited = Duration::ZERO;
        if [cancel, self.cancel.as_ref()]
            .into_iter()
            .flatten()
            .any(CancellationToken::is_cancelled)
        {
            return Err(Error::new(ErrorKind::Cancelled));
        }
        self.first_turn(cancel, deadline, call.class, policy.max_backoff)
            .await?;

        loop {
            attempt += 1;
            span.record("attempts", attempt);
            // Read now, not at the call's start: an answer to another call (or a clone's)
            // during the backoff raises it.
            let call_bookmark = options.bookmark.filter(|_| !bookmark_refused);
            let bookmark = self.session.for_request(consistency, call_bookmark);
            let request = AttemptRequest {
                endpoint: call.endpoint,
                body: &call.body,
                attempt,
                max_attempts,
                idempotency_key: idempotency_key.as_ref(),
                bookmark,
                consistency,
            };
            let attempt_span =
                trace::attempt_span(attempt, waited, call.class, idempotency_key.is_some());
            self.metrics.attempt();
            let outcome = tokio::select! {
                biased;
                () = cancelled(cancel, self.cancel.as_ref()) => Err(Failure::from(ErrorKind::Cancelled)),
                outcome = self
                    .attempt(request, timeout, deadline, hedge, &mut *receiver)
                    .instrument(attempt_span.clone()) => outcome,
            };
            self.observe_answer(outcome.as_ref().err().map(|failure| &failure.kind));
            let Failure {
                kind,
                sent: this_sent,
                source,
                statement,
                request_id,
            } = match outcome {
                Ok(body) => {
                    if !attempt_span.is_disabled() {
                        trace::attempt_succeeded(&attempt_span, body.request_id());
                    }
                    for bookmark in [body.bookmark(), receiver.bookmark()].into_iter().flatten() {
                        self.session.observe(bookmark);
                    }
                    if let Some(bucket) = &self.budget {
                        bucket.deposit();
                    }
                    return Ok(Delivered {
                        body,
                        attempts: attempt,
                        history,
                        stall: timeout,
                        cancel: [cancel.cloned(), self.cancel.clone()],
                        session: Arc::clone(&self.session),
                        may_write: call.class != OpClass::Read,
                    });
                }
                Err(failure) => failure,
            };
            trace::attempt_failed(&attempt_span, &kind, request_id.as_deref());
            sent |= this_sent;
            unsettled |= this_sent && is_unanswered(&kind);

            // The key a caller may re-send the write with, once it may have reached the server.
            let key = idempotency_key
                .as_ref()
                .filter(|_| sent)
                .and_then(|key| key.to_str().ok())
                .map(str::to_owned);
            // The error for a call ending on this failure, with what the caller needs to decide.
            let finish = |kind: ErrorKind, mut history: Vec<AttemptFailure>, source| {
                let failure = record(attempt, &kind, None, request_id.clone());
                tracing::debug!(
                    attempt,
                    reason = %failure.failure,
                    request_id = failure.request_id.as_deref(),
                    "attempt failed; not retrying"
                );
                history.push(failure);
                // A final answer from the server settles it; a transient one leaves an earlier
                // unanswered attempt unanswered.
                let outcome_unknown = call.class != OpClass::Read
                    && unsettled
                    && (is_unanswered(&kind) || is_transient(&kind) || is_refused_unread(&kind));
                Error::new(kind)
                    .with_attempts(attempt, history)
                    .with_boxed_source(source)
                    .with_sent(sent, outcome_unknown)
                    .with_idempotency_key(key.clone())
                    .with_statement_index(statement)
                    .with_request_id(request_id.clone())
            };
            if matches!(kind, ErrorKind::BookmarkAhead { .. })
                && let Some(refused) = bookmark
            {
                // Nothing ran: the bookmark is past the server's primary (another cluster, or
                // from before a failover). Drop it from the session, and send the call once more
                // without it, unless it is an execute (never sent twice) or out of time.
                self.session.drop_refused(refused);
                let out_of_time = deadline.is_some_and(|deadline| Instant::now() >= deadline);
                if call.class != OpClass::Execute && !bookmark_refused && !out_of_time {
                    bookmark_refused = true;
                    // A free attempt: it counts in the history, not against the policy's.
                    max_attempts = max_attempts.saturating_add(1);
                    let failure = record(attempt, &kind, Some(Duration::ZERO), request_id.clone());
                    tracing::info!(
                        attempt,
                        refused = %refused,
                        request_id = failure.request_id.as_deref(),
                        "the server's primary is behind the bookmark; dropped it, sending again without it"
                    );
                    history.push(failure);
                    trace::decided(&attempt_span, Decision::ResentWithoutBookmark);
                    waited = Duration::ZERO;
                    continue;
                }
            }
            if kind == ErrorKind::Cancelled
                || attempt >= max_attempts
                || !should_retry(call.class, retry_writes, &kind)
            {
                let decision = if kind == ErrorKind::Cancelled {
                    Decision::Cancelled
                } else if attempt >= max_attempts && should_retry(call.class, retry_writes, &kind) {
                    Decision::AttemptsExhausted
                } else {
                    Decision::Final
                };
                trace::decided(&attempt_span, decision);
                return Err(finish(kind, history, source));
            }
            let backoff = match call_rng.as_mut() {
                Some(rng) => delay_before_retry(&policy, attempt, &kind, rng),
                None => {
                    let mut rng = self
                        .rng
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    delay_before_retry(&policy, attempt, &kind, &mut *rng)
                }
            };
            // The adaptive rate may give the retry a later turn than its backoff (one further
            // than max_backoff is refused).
            let (delay, turn) = self.retry_wait(backoff, call.class, policy.max_backoff);
            let wakes = Instant::now().checked_add(delay);
            if turn.is_too_far()
                || deadline.is_some_and(|deadline| wakes.is_none_or(|wakes| wakes >= deadline))
            {
                tracing::debug!(
                    attempt,
                    "max_elapsed or the rate's turn too far; not retrying"
                );
                trace::decided(&attempt_span, Decision::MaxElapsed);
                drop(turn);
                let err = finish(kind, history, source);
                // Held past it by the rate, not by its own backoff: the error says so.
                return Err(if delay > backoff {
                    err.with_retry_state(self.retry_state())
                } else {
                    err
                });
            }
            let paid = match self.pay(&kind, turn) {
                Ok(paid) => paid,
                Err(state) => {
                    tracing::warn!(attempt, "retry budget exhausted; not retrying");
                    trace::decided(&attempt_span, Decision::BudgetExhausted);
                    self.metrics.budget_refused();
                    return Err(finish(kind, history, source)
                        .with_budget_exhausted()
                        .with_retry_state(state));
                }
            };
            let failure = record(attempt, &kind, Some(delay), request_id.clone());
            tracing::info!(
                attempt,
                reason = %failure.failure,
                request_id = failure.request_id.as_deref(),
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "retrying"
            );
            history.push(failure);
            trace::decided(&attempt_span, Decision::Retried);
            self.metrics.retry(&kind);
            waited = delay;
            // The attempt's span ends with the attempt, not after the wait.
            drop(attempt_span);
            tokio::select! {
                biased;
                () = cancelled(cancel, self.cancel.as_ref()) => {
                    // The retry paid for will not happen.
                    self.unpay(paid);
                    // The history ends with the attempt before, and the delay cut short.
                    let err = Error::new(ErrorKind::Cancelled)
                        .with_request_id(history.last().and_then(|f| f.request_id.clone()))
                        .with_attempts(attempt, history)
                        .with_sent(sent, call.class != OpClass::Read && unsettled)
                        .with_idempotency_key(key);
                    return Err(err);
                }
                () = tokio::time::sleep(delay) => paid.spend(),
            }
        }
    }
}

/// A final refusal the server gives before it reads the request's statement or its key (the
/// credentials, the token's rights, the request's size or form): it says nothing of what an
/// earlier attempt did, so an earlier attempt whose answer was lost stays unknown.
fn is_refused_unread(kind: &ErrorKind) -> bool {
    match kind {
        ErrorKind::Unauthorized { .. }
        | ErrorKind::ReadOnly { .. }
        | ErrorKind::PayloadTooLarge { .. } => true,
        ErrorKind::Http { status, .. } => {
            matches!(status, 400 | 401 | 403 | 404 | 405 | 413 | 415 | 431)
        }
        _ => false,
    }
}

/// A failure after which the statement may or may not have run: no answer came back from the server
/// itself (a timeout, a lost connection, a cancellation, a gateway's `502`/`504`), the server said
/// an earlier attempt is still running, or that it cannot know (`503 OUTCOME_UNKNOWN`).
fn is_unanswered(kind: &ErrorKind) -> bool {
    match kind {
        ErrorKind::Timeout { .. }
        | ErrorKind::Connection { .. }
        | ErrorKind::Cancelled
        | ErrorKind::OutcomeUnknown { .. }
        | ErrorKind::IdempotencyKeyInUse { .. } => true,
        ErrorKind::Http { status, .. } => matches!(status, 502 | 504),
        _ => false,
    }
}

/// What one attempt may spend: the per-attempt timeout, or less when `max_elapsed` is nearer.
fn attempt_budget(timeout: Option<Duration>, deadline: Option<Instant>) -> Option<Duration> {
    let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
    match (timeout, left) {
        (Some(timeout), Some(left)) => Some(timeout.min(left)),
        (one, other) => one.or(other),
    }
}

/// Runs one step of an exchange (the head, a piece of the body) within its budget. An attempt cut
/// short by it may have reached the server.
// A `Failure` is built once per attempt, next to an HTTP exchange: its size does not matter.
#[allow(clippy::result_large_err)]
pub(crate) async fn with_timeout<T, F>(budget: Option<Duration>, exchange: F) -> Result<T, Failure>
where
    F: Future<Output = Result<T, Failure>>,
{
    let began = Instant::now();
    let outcome = match budget {
        None => exchange.await,
        Some(after) => tokio::time::timeout(after, exchange)
            .await
            .unwrap_or_else(|_| Err(ErrorKind::Timeout { after }.into())),
    };
    match outcome {
        // A timeout of the HTTP client's own (the connect timeout, or one configured on a
        // caller-supplied reqwest client) says how long it took.
        Err(mut failure) => {
            if let ErrorKind::Timeout { after } = &mut failure.kind
                && after.is_zero()
            {
                *after = began.elapsed();
            }
            Err(failure)
        }
        ok => ok,
    }
}

/// Resolves when either token is cancelled; never when there is none.
pub(crate) async fn cancelled(
    call: Option<&CancellationToken>,
    client: Option<&CancellationToken>,
) {
    match (call, client) {
        (Some(a), Some(b)) => tokio::select! {
            () = a.cancelled() => {}
            () = b.cancelled() => {}
        },
        (Some(token), None) | (None, Some(token)) => token.cancelled().await,
        (None, None) => std::future::pending().await,
    }
}

fn record(
    attempt: u32,
    kind: &ErrorKind,
    retry_delay: Option<Duration>,
    request_id: Option<String>,
) -> AttemptFailure {
    let status = kind.response_status();
    let failure = match (kind.wire_code(), status) {
        (Some(code), Some(status)) => format!("{status} {code}"),
        (_, Some(status)) => status.to_string(),
        (_, None) => match kind {
            ErrorKind::Timeout { .. } => "timeout".to_owned(),
            ErrorKind::Connection { .. } => "connection".to_owned(),
            ErrorKind::Cancelled => "cancelled".to_owned(),
            other => other.to_string(),
        },
    };
    AttemptFailure {
        attempt,
        failure,
        status,
        retry_delay,
        request_id,
    }
}

/// A fresh key for one write call: 128 random bits, hex-encoded.
pub(crate) fn new_idempotency_key() -> String {
    let bits: u128 = rand::rng().random();
    format!("{bits:032x}")
}

#[cfg(test)]
mod tests;
