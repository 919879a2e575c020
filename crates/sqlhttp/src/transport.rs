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

use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{AttemptFailure, Error, ErrorKind, Result};
use crate::options::CallOptions;
use crate::response::{self, Failure};
use crate::retry::classify::{OpClass, is_transient, should_retry};
use crate::retry::{RetryPolicy, TokenBucket, backoff};

/// The header naming an attempt's number and the most the call will make, e.g. `2/3`.
pub(crate) const ATTEMPT_HEADER: &str = "sqlhttp-attempt";
/// The header carrying a write's idempotency key.
pub(crate) const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Which of the protocol's endpoints a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /api/v1/sql`: one statement.
    Sql,
    /// `POST /api/v1/batch`: several statements in one transaction.
    Batch,
    /// `POST /api/v1/describe`: the tables, or one table's columns.
    Describe,
}

/// One attempt's request, as the exchange sends it.
pub(crate) struct AttemptRequest<'a> {
    pub(crate) endpoint: Endpoint,
    pub(crate) body: &'a Bytes,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) idempotency_key: Option<&'a HeaderValue>,
}

/// The future of one exchange.
pub(crate) type ExchangeFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Body, Failure>> + Send + 'a>>;

/// A success response's body, read piece by piece as it arrives.
pub(crate) struct Body(BodyInner);

enum BodyInner {
    /// A body already whole (a simulated server, a scripted test).
    Whole(Option<Bytes>),
    /// The body of an HTTP response, still arriving.
    Http(reqwest::Response),
    /// Pieces that arrive each after its pause (tests of time on a paused clock).
    #[cfg(test)]
    Scripted(std::collections::VecDeque<(Duration, Bytes)>),
}

impl From<Bytes> for Body {
    fn from(bytes: Bytes) -> Self {
        Body(BodyInner::Whole(Some(bytes)))
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body").finish_non_exhaustive()
    }
}

impl Body {
    /// Whether the server answered with a stored outcome (`Idempotent-Replayed: true`): the
    /// request's key had been applied before, and nothing ran this time.
    pub(crate) fn replayed(&self) -> bool {
        match &self.0 {
            BodyInner::Http(response) => response
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true")),
            _ => false,
        }
    }

    /// A body whose pieces arrive each after its pause.
    #[cfg(test)]
    pub(crate) fn scripted(pieces: impl IntoIterator<Item = (Duration, Bytes)>) -> Body {
        Body(BodyInner::Scripted(pieces.into_iter().collect()))
    }

    /// The next piece, or `None` at the body's clean end. A body cut short (the connection lost,
    /// a chunked body without its end) is a connection failure.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, Failure> {
        match &mut self.0 {
            BodyInner::Whole(bytes) => Ok(bytes.take()),
            #[cfg(test)]
            BodyInner::Scripted(pieces) => match pieces.pop_front() {
                Some((pause, piece)) => {
                    tokio::time::sleep(pause).await;
                    Ok(Some(piece))
                }
                None => Ok(None),
            },
            BodyInner::Http(response) => response.chunk().await.map_err(|err| {
                let err = err.without_url();
                Failure {
                    kind: ErrorKind::Connection {
                        message: format!("response body ended early: {err}"),
                    },
                    sent: true,
                    source: Some(Box::new(err)),
                    statement: None,
                    request_id: None,
                }
            }),
        }
    }
}

/// What a call does with the body while it may still be retried: it takes the pieces until it has
/// something to hand to the caller (the whole result, or a stream's first row). Until then a
/// failure is retried as any other; after it, never (the caller may have seen rows).
// A `Failure` travels once per attempt, beside an HTTP exchange: returning it by value costs nothing
// that matters.
#[allow(clippy::result_large_err)]
pub(crate) trait Receive: Send {
    /// Forgets what an earlier attempt delivered.
    fn reset(&mut self);
    /// Takes the next piece (`None`: the body ended). `Ok(true)` once the caller can be served.
    fn take(&mut self, piece: Option<&[u8]>) -> Result<bool, Failure>;
}

/// One HTTP exchange: a request out, a success head (its body still to read) or the failure's kind
/// back. The loop around it does not know HTTP; unit tests script this seam to drive the loop on a
/// paused clock.
pub(crate) trait Exchange: Send + Sync {
    fn send<'a>(&'a self, request: AttemptRequest<'a>) -> ExchangeFuture<'a>;
}

/// The real exchange, over reqwest.
pub(crate) struct HttpExchange {
    pub(crate) http: reqwest::Client,
    pub(crate) endpoint: reqwest::Url,
    pub(crate) batch_endpoint: reqwest::Url,
    pub(crate) describe_endpoint: reqwest::Url,
    pub(crate) authorization: Option<HeaderValue>,
    pub(crate) user_agent: HeaderValue,
}

/// Everything the transport needs, fixed when the client is built.
pub(crate) struct Transport {
    pub(crate) exchange: Box<dyn Exchange>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) policy: RetryPolicy,
    pub(crate) retry_writes: bool,
    pub(crate) budget: Option<TokenBucket>,
    pub(crate) rng: Mutex<StdRng>,
    pub(crate) cancel: Option<CancellationToken>,
}

/// One call: a request body sent as many times as the rules allow.
pub(crate) struct Call<'a> {
    pub(crate) class: OpClass,
    pub(crate) endpoint: Endpoint,
    pub(crate) body: Bytes,
    /// For debug-level logs only.
    pub(crate) sql: &'a str,
    /// The call's overrides of the client's settings (its idempotency key is the insert's business:
    /// see `idempotency_key` below).
    pub(crate) options: &'a CallOptions,
    /// The key to send on every attempt of a write; `None` makes one for the call.
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
        let span = tracing::info_span!(
            "sqlhttp.call",
            op = call.class.as_str(),
            attempts = tracing::field::Empty,
        );
        self.run(call, receiver, &span)
            .instrument(span.clone())
            .await
    }

    /// One attempt: the response head within the attempt's budget, then the body's pieces, each
    /// within the budget again (a stall, not the whole download), until `receiver` is served.
    async fn attempt(
        &self,
        request: AttemptRequest<'_>,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
        receiver: &mut dyn Receive,
    ) -> Result<Body, Failure> {
        receiver.reset();
        let exchange = self.exchange.send(request);
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
        tracing::debug!(sql = call.sql, "sending statement");
        let options = call.options;
        let cancel = options.cancel.as_ref();
        // Per-call settings win over the client's.
        let timeout = options.timeout.unwrap_or(self.timeout);
        let policy = options.retry.unwrap_or(self.policy);
        let retry_writes = options.retry_writes.unwrap_or(self.retry_writes);
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
        let max_attempts = match call.class {
            OpClass::Read => policy.max_attempts,
            OpClass::Write if retry_writes => policy.max_attempts,
            OpClass::Write | OpClass::Execute => 1,
        };
        let idempotency_key = match call.class {
            OpClass::Write => Some(call.idempotency_key.unwrap_or_else(|| {
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
        if [cancel, self.cancel.as_ref()]
            .into_iter()
            .flatten()
            .any(CancellationToken::is_cancelled)
        {
            return Err(Error::new(ErrorKind::Cancelled));
        }

        loop {
            attempt += 1;
            span.record("attempts", attempt);
            let request = AttemptRequest {
                endpoint: call.endpoint,
                body: &call.body,
                attempt,
                max_attempts,
                idempotency_key: idempotency_key.as_ref(),
            };
            let outcome = tokio::select! {
                biased;
                () = cancelled(cancel, self.cancel.as_ref()) => Err(Failure::from(ErrorKind::Cancelled)),
                outcome = self.attempt(request, timeout, deadline, &mut *receiver) => outcome,
            };
            let Failure {
                kind,
                sent: this_sent,
                source,
                statement,
                request_id,
            } = match outcome {
                Ok(body) => {
                    if let Some(bucket) = &self.budget {
                        bucket.deposit();
                    }
                    return Ok(Delivered {
                        body,
                        attempts: attempt,
                        history,
                        stall: timeout,
                        cancel: [cancel.cloned(), self.cancel.clone()],
                    });
                }
                Err(failure) => failure,
            };
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
                    && (is_unanswered(&kind) || is_transient(&kind));
                Error::new(kind)
                    .with_attempts(attempt, history)
                    .with_boxed_source(source)
                    .with_sent(sent, outcome_unknown)
                    .with_idempotency_key(key.clone())
                    .with_statement_index(statement)
                    .with_request_id(request_id.clone())
            };
            if kind == ErrorKind::Cancelled
                || attempt >= max_attempts
                || !should_retry(call.class, retry_writes, &kind)
            {
                return Err(finish(kind, history, source));
            }
            let delay = match call_rng.as_mut() {
                Some(rng) => delay_before_retry(&policy, attempt, &kind, rng),
                None => {
                    let mut rng = self
                        .rng
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    delay_before_retry(&policy, attempt, &kind, &mut *rng)
                }
            };
            let wakes = Instant::now().checked_add(delay);
            if let Some(deadline) = deadline
                && wakes.is_none_or(|wakes| wakes >= deadline)
            {
                tracing::debug!(attempt, "max_elapsed reached; not retrying");
                return Err(finish(kind, history, source));
            }
            let after_timeout = matches!(kind, ErrorKind::Timeout { .. });
            if let Some(bucket) = &self.budget
                && !bucket.withdraw(after_timeout)
            {
                tracing::warn!(attempt, "retry budget exhausted; not retrying");
                return Err(finish(kind, history, source).with_budget_exhausted());
            }
            let failure = record(attempt, &kind, Some(delay), request_id.clone());
            tracing::info!(
                attempt,
                reason = %failure.failure,
                request_id = failure.request_id.as_deref(),
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "retrying"
            );
            history.push(failure);
            tokio::select! {
                biased;
                () = cancelled(cancel, self.cancel.as_ref()) => {
                    // The retry paid for will not happen.
                    if let Some(bucket) = &self.budget {
                        bucket.refund(after_timeout);
                    }
                    // The history ends with the attempt before, and the delay cut short.
                    let err = Error::new(ErrorKind::Cancelled)
                        .with_request_id(history.last().and_then(|f| f.request_id.clone()))
                        .with_attempts(attempt, history)
                        .with_sent(sent, call.class != OpClass::Read && unsettled)
                        .with_idempotency_key(key);
                    return Err(err);
                }
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// The server's `Retry-After` when it gave a valid one (on `429`, `503` and `409
/// IDEMPOTENCY_KEY_IN_USE`), capped by `max_backoff`; else the computed backoff.
fn delay_before_retry<R: rand::Rng + ?Sized>(
    policy: &RetryPolicy,
    attempt: u32,
    kind: &ErrorKind,
    rng: &mut R,
) -> Duration {
    let server_wait = match kind {
        ErrorKind::RateLimited { retry_after, .. }
        | ErrorKind::Unavailable { retry_after, .. }
        | ErrorKind::IdempotencyKeyInUse { retry_after, .. } => *retry_after,
        _ => None,
    };
    match server_wait {
        Some(wait) => wait.min(policy.max_backoff),
        None => backoff::delay(policy, attempt, rng),
    }
}

/// A failure after which the statement may or may not have run: no answer came back from the server
/// itself (a timeout, a lost connection, a cancellation, a gateway's `502`/`504`), or the server said
/// an earlier attempt is still running.
fn is_unanswered(kind: &ErrorKind) -> bool {
    match kind {
        ErrorKind::Timeout { .. }
        | ErrorKind::Connection { .. }
        | ErrorKind::Cancelled
        | ErrorKind::IdempotencyKeyInUse { .. } => true,
        ErrorKind::Http { status, .. } => matches!(status, 502 | 504),
        _ => false,
    }
}

impl Exchange for HttpExchange {
    fn send<'a>(&'a self, request: AttemptRequest<'a>) -> ExchangeFuture<'a> {
        Box::pin(self.exchange(request))
    }
}

impl HttpExchange {
    /// One HTTP exchange: the request, the status, and a success body to read (an error's whole).
    async fn exchange(&self, request: AttemptRequest<'_>) -> Result<Body, Failure> {
        let AttemptRequest {
            endpoint,
            body,
            attempt,
            max_attempts,
            idempotency_key,
        } = request;
        let mut request = self
            .http
            .post(match endpoint {
                Endpoint::Sql => self.endpoint.clone(),
                Endpoint::Batch => self.batch_endpoint.clone(),
                Endpoint::Describe => self.describe_endpoint.clone(),
            })
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, self.user_agent.clone())
            .header(ATTEMPT_HEADER, format!("{attempt}/{max_attempts}"))
            .body(body.clone());
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        if let Some(key) = idempotency_key {
            request = request.header(IDEMPOTENCY_KEY_HEADER, key.clone());
        }
        let mut response = request.send().await.map_err(response::from_transport)?;
        let status = response.status();
        if status.is_success() {
            return Ok(Body(BodyInner::Http(response)));
        }
        let headers = std::mem::take(response.headers_mut());
        // The status decides; a body cut short only costs the server's message.
        let body = response.bytes().await.unwrap_or_default();
        Err(response::failure_from_status(
            status.as_u16(),
            &headers,
            &body,
        ))
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
#[path = "transport_tests.rs"]
mod tests;
