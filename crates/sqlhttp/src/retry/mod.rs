//! Retry rules: what is retried, how long to wait, and when to stop.
//!
//! # What is retried
//!
//! The method the caller chose declares the operation's class; the SDK never parses SQL.
//!
//! | class | methods | retried |
//! |---|---|---|
//! | read | `ping`, `query`, `query_table`, a [`read_only`](crate::Batch::read_only) `batch` | by default |
//! | write | `insert`, `batch` (one key for the whole batch) | only with `retry_writes(true)`, [client-wide](crate::ClientBuilder::retry_writes) or on the call ([insert](crate::Insert::retry_writes), [batch](crate::Batch::retry_writes)) |
//! | execute | `execute`, and its `fetch_*` for `RETURNING` rows | never, whatever the configuration |
//! | transaction step | an interactive [`Transaction`](crate::Transaction)'s open, statements, COMMIT and rollback | by default (the server sequences them: a re-sent statement or COMMIT is answered from its stored result) |
//!
//! A failure is retried when it is transient: a connection refused, reset or closed before a complete
//! response (or, for a stream, before its first row); a streamed body that the server ends with a
//! transient error (`UNAVAILABLE`) before the first row; an attempt timeout; `408`, `429`, and every `5xx` except `501`. For writes, a `409
//! IDEMPOTENCY_KEY_IN_USE` is transient too (the first attempt is still running on the server). Every
//! other `4xx` (bad SQL, bad credentials, a constraint violation, an oversized payload), `501`, a complete
//! `2xx` body that does not decode, a TLS certificate failure, a configuration error and the caller's
//! cancellation are final: the server would decide them the same way next time.
//!
//! **`503 OUTCOME_UNKNOWN`** (the server could not learn whether the write or COMMIT took effect)
//! is transient like any `5xx`: a keyed write under `retry_writes` is re-sent with its key (applied
//! at most once), a transaction's step too (a re-sent COMMIT reads the commit record); `execute`
//! is not. A call other than a read that ends on it has
//! [`Error::is_outcome_unknown`](crate::Error::is_outcome_unknown) set, whatever earlier attempts
//! met. `503 UNAVAILABLE` stays "busy, nothing ran".
//!
//! **`409 BOOKMARK_AHEAD`** (the request's bookmark is past the server's primary: nothing ran) drops
//! the client's session bookmark and sends the call once more at once, without it, for every class
//! but `execute`; that attempt is free (it is not counted against `max_attempts` nor paid from the
//! budget, but stays within `max_elapsed`). An `execute` returns the error, and its next call goes
//! out without the bookmark.
//!
//! **A transaction whose step or COMMIT has an unknown outcome.** A statement whose outcome is
//! unknown after its retries ends the transaction: the SDK rolls it back and never sends its COMMIT.
//! A COMMIT whose outcome is unknown (`OUTCOME_UNKNOWN`, a timeout, a lost connection, a `5xx` after
//! it was sent) is settled by asking the server (`/api/v1/transaction/outcome`) with backoff until
//! it knows, within `max_elapsed` (or `max_attempts` asks without it), the budget and the client's
//! cancellation; see [`Transaction::commit`](crate::Transaction::commit).
//!
//! **A request must not be retried unless the server can safely take it twice.** Reads can. A write
//! carries an `Idempotency-Key` that is the same on every attempt, so a server that honours it (the
//! reference server does) applies it exactly once; against a server that ignores the key, a write whose
//! response was lost after the server committed it is applied twice when retried. That risk is why
//! `retry_writes` is opt-in. `execute` runs arbitrary statements (DDL, `UPDATE ... SET n = n + 1`) and is
//! never retried.
//!
//! # Timing
//!
//! * `timeout` bounds one attempt's wait for the response head, then each stall of its body (no byte
//!   for that long), not the whole download; each attempt gets all of it.
//! * A call is retried until it has what it hands to the caller: the whole result for `fetch_all`,
//!   `query_table`, `execute` and `insert`, the first row for [`Query::fetch`](crate::Query::fetch),
//!   `fetch_one` and `fetch_optional`. After a stream's first row, a failure ends the stream with
//!   an error and is never retried (rows would repeat).
//! * [`RetryPolicy::max_elapsed`] caps the whole sequence, backoff included: no sleep starts that would
//!   end past it and no attempt runs past it; reaching it returns the last failure.
//! * Backoff before retry *n* is drawn uniformly from `[0, min(max_backoff, initial_backoff * 2^(n-1))]`
//!   (full jitter), so a fleet that failed together does not come back in lockstep.
//! * A retry after a **throttle** (the server said "slow down": a `429`, a `503` with `Retry-After`,
//!   a `409 IDEMPOTENCY_KEY_IN_USE`) backs off from [`RetryPolicy::throttle_initial_backoff`] (1 s)
//!   and costs the budget [`RetryBudget::throttle_cost`] (5 tokens); a retry after a **failure** (a
//!   lost connection, a timeout, any other `5xx`) backs off from `initial_backoff` (100 ms) and costs
//!   [`RetryBudget::retry_cost`] (14; [`RetryBudget::timeout_cost`] after a timeout, 14). Nothing
//!   failed in a throttle, so waiting is cheap and retries that wait do not drain the budget the way
//!   an outage should (ADR 0054).
//! * A valid `Retry-After` (on a `429`, a `503` or a `409 IDEMPOTENCY_KEY_IN_USE`) is honoured up to
//!   the computed delay plus [`RetryPolicy::retry_after_max_extra`] (5 s): a server may ask for less
//!   than the computed delay, never park a caller for longer; under [`Jitter::Full`] up to a tenth
//!   of it is added at random, so that a fleet told the same wait does not return at one instant.
//!   (A key in use means an earlier attempt
//!   of the same write is still running: retrying sooner than the server asks only spends attempts
//!   while it runs.)
//! * With [`adaptive_rate`](crate::ClientBuilder::adaptive_rate) on, the client also slows its own
//!   send rate after throttles (CUBIC, as the AWS SDKs' adaptive mode), which may delay even a first
//!   attempt; a call whose wait would end past its `max_elapsed` fails at once with
//!   [`ErrorKind::ClientRateLimited`](crate::ErrorKind::ClientRateLimited).
//!
//! # Hedged reads
//!
//! With [`hedge_reads`](crate::ClientBuilder::hedge_reads) (or `.hedge(true)` on one read), a
//! verified read (`query`, `query_table`, a read-only `batch`: sent with `"read_only": true`) whose
//! answer has not begun after the [`HedgePolicy`](crate::HedgePolicy)'s delay is sent a second time
//! on another connection, and the first answer wins; the other request is dropped. A hedge is not a
//! retry: it is not counted in `max_attempts` nor paid from the retry budget, but from a hedge
//! budget of its own (10% of recent reads). Writes, `execute`, transaction steps and describes are
//! never hedged.
//!
//! # Per call
//!
//! Every request builder takes `.timeout(..)` and `.cancel_on(..)`; reads, `insert` and `batch` take
//! `.retry(policy)`; `insert` and `batch` take `.retry_writes(..)` and `.idempotency_key(..)`. A per-call setting
//! wins over the client's for that call; the retry budget is always the client's. `execute` has no
//! `.retry`: it is never retried, so a setting there could only mislead.
//!
//! # Why a budget, and not only an attempt count
//!
//! Three attempts per call look harmless, but when a server is down every call makes three, and a fleet
//! triples its load on the server exactly when it is least able to take it: a retry storm. The
//! [`RetryBudget`] is a token bucket shared by every clone of a `Client`: retries withdraw from it,
//! successes refill it slowly, so during an outage retries fall to a small fraction of traffic while an
//! isolated blip is still retried in full.

pub(crate) mod backoff;
mod budget;
pub(crate) mod classify;
pub(crate) mod cost;
pub(crate) mod rate;
pub(crate) mod retry_after;
mod state;

use std::time::Duration;

pub use backoff::Jitter;
pub use budget::RetryBudget;
pub(crate) use budget::TokenBucket;
pub use state::RetryState;

/// How a call retries: attempt count, backoff and the elapsed-time ceiling.
///
/// A `Copy` value of settings; the running state (the random source, the budget) lives in the client.
/// Setters are `with_*` and getters carry the setting's plain name, as in the AWS SDK's `RetryConfig`
/// and backon's builders.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | [`with_max_attempts`](Self::with_max_attempts) | 3 (the first attempt and two retries) |
/// | [`with_initial_backoff`](Self::with_initial_backoff) | 100 ms (after a failure) |
/// | [`with_throttle_initial_backoff`](Self::with_throttle_initial_backoff) | 1 s (after a throttle) |
/// | [`with_max_backoff`](Self::with_max_backoff) | 5 s |
/// | [`with_retry_after_max_extra`](Self::with_retry_after_max_extra) | 5 s (a `Retry-After` is honoured up to the computed delay plus this) |
/// | [`with_jitter`](Self::with_jitter) | [`Jitter::Full`] |
/// | [`with_max_elapsed`](Self::with_max_elapsed) | none |
/// | [`with_jitter_seed`](Self::with_jitter_seed) | none (seeded from the OS) |
///
/// ```
/// use std::time::Duration;
/// use sqlhttp::RetryPolicy;
///
/// let policy = RetryPolicy::new()
///     .with_max_attempts(5)
///     .with_max_elapsed(Duration::from_secs(20));
/// assert_eq!(policy.max_attempts(), 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) throttle_initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) retry_after_max_extra: Duration,
    pub(crate) max_elapsed: Option<Duration>,
    pub(crate) jitter: Jitter,
    pub(crate) seed: Option<u64>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The default policy (see the table above).
    pub const fn new() -> Self {
        Self {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(100),
            throttle_initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
            retry_after_max_extra: Duration::from_secs(5),
            max_elapsed: None,
            jitter: Jitter::Full,
            seed: None,
        }
    }

    /// A policy that makes one attempt and never retries.
    pub const fn never() -> Self {
        Self::new().with_max_attempts(1)
    }

    /// Attempts in all, the first included. `1` turns retrying off; `0` is rejected by `build()`.
    #[must_use]
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The cap of the first backoff after a failure (a lost connection, a timeout, a `5xx` without
    /// `Retry-After`); each later one doubles, up to `max_backoff`.
    #[must_use]
    pub const fn with_initial_backoff(mut self, delay: Duration) -> Self {
        self.initial_backoff = delay;
        self
    }

    /// The cap of the first backoff after a throttle (a `429`, a `503` with `Retry-After`, a `409
    /// IDEMPOTENCY_KEY_IN_USE`); each later one doubles, up to `max_backoff`, which also caps this
    /// one. Used when the server gave no `Retry-After`, and as the base the server's is held to.
    #[must_use]
    pub const fn with_throttle_initial_backoff(mut self, delay: Duration) -> Self {
        self.throttle_initial_backoff = delay;
        self
    }

    /// The largest computed delay slept between attempts. A server's `Retry-After` may exceed it
    /// by at most [`retry_after_max_extra`](Self::retry_after_max_extra).
    #[must_use]
    pub const fn with_max_backoff(mut self, delay: Duration) -> Self {
        self.max_backoff = delay;
        self
    }

    /// How much longer than the computed delay a server's `Retry-After` is honoured: the wait is
    /// the server's value, at most the computed delay plus this. Zero holds the server to the
    /// computed delay.
    #[must_use]
    pub const fn with_retry_after_max_extra(mut self, extra: Duration) -> Self {
        self.retry_after_max_extra = extra;
        self
    }

    /// A ceiling on the whole call, attempts and backoff included.
    #[must_use]
    pub const fn with_max_elapsed(mut self, limit: Duration) -> Self {
        self.max_elapsed = Some(limit);
        self
    }

    /// How the computed backoff is randomised.
    #[must_use]
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Seeds the jitter's random source, so that delays repeat from run to run (for tests).
    #[must_use]
    pub const fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    // Getters

    /// Attempts in all, the first included.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The cap of the first backoff after a failure.
    pub const fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }

    /// The cap of the first backoff after a throttle.
    pub const fn throttle_initial_backoff(&self) -> Duration {
        self.throttle_initial_backoff
    }

    /// The largest computed delay slept between attempts.
    pub const fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// How much longer than the computed delay a server's `Retry-After` is honoured.
    pub const fn retry_after_max_extra(&self) -> Duration {
        self.retry_after_max_extra
    }

    /// The ceiling on the whole call, if any.
    pub const fn max_elapsed(&self) -> Option<Duration> {
        self.max_elapsed
    }

    /// How the computed backoff is randomised.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The jitter's seed, if one was set.
    pub const fn jitter_seed(&self) -> Option<u64> {
        self.seed
    }

    /// Checks that the settings can work.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("max_attempts must be at least 1".into());
        }
        if self.initial_backoff > self.max_backoff {
            return Err(format!(
                "initial_backoff ({:?}) is larger than max_backoff ({:?})",
                self.initial_backoff, self.max_backoff
            ));
        }
        if self.max_elapsed == Some(Duration::ZERO) {
            return Err("max_elapsed must be larger than zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let p = RetryPolicy::default();
        assert_eq!(p, RetryPolicy::new());
        assert_eq!(p.max_attempts, 3);
        assert_eq!(p.initial_backoff, Duration::from_millis(100));
        assert_eq!(p.throttle_initial_backoff, Duration::from_secs(1));
        assert_eq!(p.max_backoff, Duration::from_secs(5));
        assert_eq!(p.retry_after_max_extra, Duration::from_secs(5));
        assert_eq!(p.max_elapsed, None);
        assert_eq!(p.jitter, Jitter::Full);
        assert_eq!(p.seed, None);
        assert_eq!(RetryPolicy::never().max_attempts, 1);
        assert_eq!(
            RetryBudget::default(),
            RetryBudget::new()
                .with_capacity(500)
                .with_throttle_cost(5)
                .with_retry_cost(14)
                .with_timeout_cost(14)
                .with_success_deposit(1)
        );
    }

    #[test]
    fn validation_names_what_cannot_work() {
        assert!(RetryPolicy::new().validate().is_ok());
        assert!(RetryPolicy::never().validate().is_ok());
        let zero = RetryPolicy::new()
            .with_max_attempts(0)
            .validate()
            .unwrap_err();
        assert!(zero.contains("max_attempts"), "{zero}");
        let inverted = RetryPolicy::new()
            .with_initial_backoff(Duration::from_secs(6))
            .validate()
            .unwrap_err();
        assert!(inverted.contains("initial_backoff"), "{inverted}");
        let elapsed = RetryPolicy::new()
            .with_max_elapsed(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(elapsed.contains("max_elapsed"), "{elapsed}");
        assert!(
            RetryPolicy::new()
                .with_max_elapsed(Duration::MAX)
                .validate()
                .is_ok()
        );
    }
}
