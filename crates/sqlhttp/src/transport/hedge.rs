//! Hedged reads: a verified read whose answer has not begun after a delay is sent a second time, on
//! another connection, and the first complete answer head wins; the other exchange is dropped
//! (its connection closed). A hedge budget of its own, a share of recent reads, stops hedging when
//! many reads are slow (a partial outage), where hedging every one would double the load.
//!
//! Only verified reads are hedged: a call of class read to the statement or batch endpoint (what the
//! SDK sends with `"read_only": true`, which the server refuses to run as a write). Never a write,
//! an `execute`, a transaction's step or a describe. The second copy goes through the same exchange
//! (the client's connection pool): the first copy's connection is busy, so it leaves on another
//! one; behind a load balancer (or a DNS name with several addresses) that is another server.
//!
//! This file holds the settings ([`HedgePolicy`]), the client's running state (recent latencies,
//! the hedge budget) and the race of one attempt. It knows nothing of retries, the retry budget,
//! timeouts or bodies beyond their head: the attempt loop puts its own rules around the race.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::body::Body;
use super::exchange::{AttemptRequest, Endpoint, Exchange};
use crate::response::Failure;
use crate::retry::classify::{OpClass, is_transient};
use crate::retry::cost::Cause;

/// When a hedge goes out: a fixed delay, or a percentile of the client's recent read latency.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum HedgeDelay {
    /// After this long without the answer's head; more than zero (`build()` refuses zero, which
    /// would send every read twice at once).
    Fixed(Duration),
    /// After this percentile (1 to 99) of the time to the answer's head of the client's last 1,000
    /// reads. No hedge is sent until 20 reads have been timed.
    Percentile(u8),
}

/// How reads are hedged ([`ClientBuilder::hedge_reads`](crate::ClientBuilder::hedge_reads), and
/// per call with `.hedge(true)`).
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | [`with_delay`](Self::with_delay) | [`HedgeDelay::Percentile(95)`](HedgeDelay::Percentile) |
/// | [`with_max_percent`](Self::with_max_percent) | 10: hedges are at most a tenth of recent reads |
///
/// ```
/// use std::time::Duration;
/// use sqlhttp::{HedgeDelay, HedgePolicy};
///
/// let policy = HedgePolicy::new()
///     .with_delay(HedgeDelay::Fixed(Duration::from_millis(50)))
///     .with_max_percent(5);
/// assert_eq!(policy.max_percent(), 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HedgePolicy {
    delay: HedgeDelay,
    max_percent: u32,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl HedgePolicy {
    /// The default policy (see the table above).
    pub const fn new() -> Self {
        Self {
            delay: HedgeDelay::Percentile(95),
            max_percent: 10,
        }
    }

    /// When the second copy goes out.
    #[must_use]
    pub const fn with_delay(mut self, delay: HedgeDelay) -> Self {
        self.delay = delay;
        self
    }

    /// The most hedges as a percentage of the client's recent reads (1 to 100): each read earns
    /// this share of a hedge, a hedge spends a whole one, and at most 10 are saved up. When reads
    /// are slow across the board, hedging stops at this share instead of doubling the load.
    #[must_use]
    pub const fn with_max_percent(mut self, percent: u32) -> Self {
        self.max_percent = percent;
        self
    }

    /// When the second copy goes out.
    pub const fn delay(&self) -> HedgeDelay {
        self.delay
    }

    /// The most hedges as a percentage of recent reads.
    pub const fn max_percent(&self) -> u32 {
        self.max_percent
    }

    /// Checks that the settings can work.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let HedgeDelay::Percentile(p) = self.delay
            && !(1..=99).contains(&p)
        {
            return Err(format!("a hedge's percentile is 1 to 99, not {p}"));
        }
        if self.delay == HedgeDelay::Fixed(Duration::ZERO) {
            return Err(
                "a hedge's fixed delay is more than zero (at zero every read is sent twice at \
                 once, up to the hedge budget)"
                    .to_owned(),
            );
        }
        if !(1..=100).contains(&self.max_percent) {
            return Err(format!(
                "a hedge's max_percent is 1 to 100, not {}",
                self.max_percent
            ));
        }
        Ok(())
    }
}

/// Reads timed for the percentile delay.
const SAMPLES: usize = 1_000;
/// Reads timed before a percentile delay is trusted.
const MIN_SAMPLES: usize = 20;
/// A hedge's price in the budget's units; a read earns `max_percent` of them.
const HEDGE_COST: u32 = 100;
/// The most hedges saved up.
const MAX_SAVED: u32 = 10;

/// The client's hedging state, shared by its clones: the policy, recent latencies, the budget.
#[derive(Debug, Default)]
pub(crate) struct Hedging {
    policy: Option<HedgePolicy>,
    state: Mutex<State>,
    sent: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    samples: VecDeque<Duration>,
    /// The percentile last computed, for which percentile, and samples taken since.
    cached: Option<(u8, Duration)>,
    since: usize,
    units: u32,
}

/// How one call is hedged: its policy and, when known, the delay.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    delay: Option<Duration>,
    max_percent: u32,
}

impl Hedging {
    pub(crate) fn new(policy: Option<HedgePolicy>) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// Hedges sent so far by this client and its clones.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The plan of a call: `None` unless it is a verified read and hedging is on for it (the
    /// call's `hedge` setting, else the client's). Earns the call its share of a hedge.
    pub(crate) fn plan(
        &self,
        class: OpClass,
        endpoint: Endpoint,
        asked: Option<bool>,
    ) -> Option<Plan> {
        if class != OpClass::Read || !matches!(endpoint, Endpoint::Sql | Endpoint::Batch) {
            return None;
        }
        let policy = match asked {
            Some(false) => return None,
            Some(true) => self.policy.unwrap_or_default(),
            None => self.policy?,
        };
        let mut s = self.state();
        let saved = HEDGE_COST * MAX_SAVED;
        s.units = (s.units + policy.max_percent).min(saved);
        let delay = match policy.delay {
            HedgeDelay::Fixed(delay) => Some(delay),
            HedgeDelay::Percentile(p) => s.percentile(p),
        };
        Some(Plan {
            delay,
            max_percent: policy.max_percent,
        })
    }

    /// Spends a hedge from the budget, or says there is none left.
    fn take(&self) -> bool {
        let mut s = self.state();
        if s.units < HEDGE_COST {
            return false;
        }
        s.units -= HEDGE_COST;
        self.sent.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn record(&self, took: Duration) {
        let mut s = self.state();
        if s.samples.len() == SAMPLES {
            s.samples.pop_front();
        }
        s.samples.push_back(took);
        s.since += 1;
    }
}

impl State {
    /// The `p`th percentile of the recent latencies; recomputed once 16 new samples came in.
    fn percentile(&mut self, p: u8) -> Option<Duration> {
        if self.samples.len() < MIN_SAMPLES {
            return None;
        }
        if let Some((cached_p, value)) = self.cached
            && cached_p == p
            && self.since < 16
        {
            return Some(value);
        }
        let mut sorted: Vec<Duration> = self.samples.iter().copied().collect();
        sorted.sort_unstable();
        let rank = (sorted.len() * usize::from(p)).div_ceil(100).max(1) - 1;
        let value = sorted[rank.min(sorted.len() - 1)];
        self.cached = Some((p, value));
        self.since = 0;
        Some(value)
    }
}

/// One attempt's exchange, hedged under `plan` when there is one: the head of the first answer to
/// succeed, the other exchange dropped. When both copies fail, the one that tells most (see
/// [`telling`]), marked sent if either was.
pub(crate) async fn send(
    exchange: &dyn Exchange,
    hedging: &Hedging,
    request: AttemptRequest<'_>,
    plan: Option<Plan>,
) -> Result<Body, Failure> {
    let Some(plan) = plan else {
        return exchange.send(request).await;
    };
    let started = Instant::now();
    let copy = AttemptRequest {
        endpoint: request.endpoint,
        body: request.body,
        attempt: request.attempt,
        max_attempts: request.max_attempts,
        idempotency_key: request.idempotency_key,
        bookmark: request.bookmark,
        consistency: request.consistency,
    };
    let mut first = exchange.send(request);
    let outcome = match plan.delay {
        None => first.await,
        Some(delay) => {
            let early = tokio::select! {
                biased;
                outcome = &mut first => Some(outcome),
                () = tokio::time::sleep(delay) => None,
            };
            match early {
                Some(outcome) => outcome,
                None if hedging.take() => {
                    tracing::debug!(
                        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        max_percent = plan.max_percent,
                        "no answer yet; hedging the read on another connection"
                    );
                    race(first, exchange.send(copy)).await
                }
                None => first.await,
            }
        }
    };
    if outcome.is_ok() {
        hedging.record(started.elapsed());
    }
    outcome
}

/// The first success of two exchanges; the other is dropped when this returns.
async fn race<A, B>(first: A, second: B) -> Result<Body, Failure>
where
    A: Future<Output = Result<Body, Failure>>,
    B: Future<Output = Result<Body, Failure>>,
{
    let (mut first, mut second) = (std::pin::pin!(first), std::pin::pin!(second));
    let (mut first_failed, mut second_failed) = (None::<Failure>, None::<Failure>);
    loop {
        tokio::select! {
            outcome = &mut first, if first_failed.is_none() => match outcome {
                Ok(body) => return Ok(body),
                Err(failure) => first_failed = Some(failure),
            },
            outcome = &mut second, if second_failed.is_none() => match outcome {
                Ok(body) => return Ok(body),
                Err(failure) => second_failed = Some(failure),
            },
        }
        if first_failed.is_some() && second_failed.is_some() {
            let (first, second) = (first_failed.take(), second_failed.take());
            return Err(telling(first.expect("failed"), second.expect("failed")));
        }
    }
}

/// Of two failed copies of one read, the failure that tells the attempt loop the most: the
/// server's final answer about the statement (a retry would get it again), else a throttle (its
/// `Retry-After` and the adaptive rate's signal must not be lost to the other copy's lost
/// connection), else the first copy's. Sent if either was.
fn telling(first: Failure, second: Failure) -> Failure {
    let rank = |failure: &Failure| {
        if !is_transient(&failure.kind) {
            2
        } else if Cause::of(&failure.kind) == Cause::Throttle {
            1
        } else {
            0
        }
    };
    let sent = first.sent || second.sent;
    let mut chosen = if rank(&second) > rank(&first) {
        second
    } else {
        first
    };
    chosen.sent = sent;
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn failed(kind: ErrorKind, sent: bool) -> Failure {
        Failure {
            sent,
            ..Failure::from(kind)
        }
    }

    fn lost() -> ErrorKind {
        ErrorKind::Connection {
            message: "reset".into(),
        }
    }

    fn throttled() -> ErrorKind {
        ErrorKind::Unavailable {
            retry_after: Some(Duration::from_secs(2)),
            message: "busy".into(),
        }
    }

    fn final_answer() -> ErrorKind {
        ErrorKind::Sql {
            code: "SQL_ERROR".into(),
            message: "no such table".into(),
        }
    }

    /// Both copies of a hedged read failed: the throttle's wait survives the other copy's lost
    /// connection, in either order, and the server's final answer beats both; sent if either
    /// copy was.
    #[tokio::test]
    async fn both_copies_failed_answers_the_failure_that_tells_most() {
        let cases = [
            (lost(), throttled(), "throttle"),
            (throttled(), lost(), "throttle"),
            (throttled(), final_answer(), "final"),
            (final_answer(), lost(), "final"),
            (lost(), lost(), "first"),
        ];
        for (first, second, expected) in cases {
            let first_kind = first.to_string();
            let outcome = race(async { Err::<Body, _>(failed(first, false)) }, async {
                Err::<Body, _>(failed(second, true))
            })
            .await;
            let Err(chosen) = outcome else {
                panic!("both copies failed")
            };
            assert!(chosen.sent, "the second copy was sent");
            match expected {
                "throttle" => assert!(
                    matches!(
                        chosen.kind,
                        ErrorKind::Unavailable {
                            retry_after: Some(_),
                            ..
                        }
                    ),
                    "{:?}",
                    chosen.kind
                ),
                "final" => assert!(
                    matches!(chosen.kind, ErrorKind::Sql { .. }),
                    "{:?}",
                    chosen.kind
                ),
                _ => assert_eq!(chosen.kind.to_string(), first_kind),
            }
        }
    }

    #[test]
    fn defaults_and_validation() {
        let p = HedgePolicy::default();
        assert_eq!(p, HedgePolicy::new());
        assert_eq!(p.delay(), HedgeDelay::Percentile(95));
        assert_eq!(p.max_percent(), 10);
        assert!(p.validate().is_ok());
        let zero = p.with_delay(HedgeDelay::Fixed(Duration::ZERO)).validate();
        assert!(zero.unwrap_err().contains("more than zero"));
        assert!(
            p.with_delay(HedgeDelay::Fixed(Duration::from_millis(1)))
                .validate()
                .is_ok()
        );
        for bad in [0, 100] {
            let err = p
                .with_delay(HedgeDelay::Percentile(bad))
                .validate()
                .unwrap_err();
            assert!(err.contains("percentile"), "{err}");
        }
        for bad in [0, 101] {
            let err = p.with_max_percent(bad).validate().unwrap_err();
            assert!(err.contains("max_percent"), "{err}");
        }
    }

    #[test]
    fn only_verified_reads_are_planned() {
        let h = Hedging::new(Some(HedgePolicy::new()));
        assert!(h.plan(OpClass::Read, Endpoint::Sql, None).is_some());
        assert!(h.plan(OpClass::Read, Endpoint::Batch, None).is_some());
        assert!(h.plan(OpClass::Read, Endpoint::Sql, Some(false)).is_none());
        assert!(
            h.plan(OpClass::Read, Endpoint::Describe, Some(true))
                .is_none()
        );
        for class in [OpClass::Write, OpClass::Execute, OpClass::Step] {
            for endpoint in [Endpoint::Sql, Endpoint::Batch] {
                assert!(h.plan(class, endpoint, Some(true)).is_none(), "{class:?}");
            }
        }
        let off = Hedging::new(None);
        assert!(off.plan(OpClass::Read, Endpoint::Sql, None).is_none());
        assert!(off.plan(OpClass::Read, Endpoint::Sql, Some(true)).is_some());
    }

    #[test]
    fn the_percentile_waits_for_twenty_samples_then_follows_them() {
        let h = Hedging::new(Some(HedgePolicy::new()));
        for ms in 1..=19 {
            h.record(Duration::from_millis(ms));
        }
        let plan = h.plan(OpClass::Read, Endpoint::Sql, None).unwrap();
        assert_eq!(plan.delay, None);
        for ms in 20..=100 {
            h.record(Duration::from_millis(ms));
        }
        let plan = h.plan(OpClass::Read, Endpoint::Sql, None).unwrap();
        assert_eq!(plan.delay, Some(Duration::from_millis(95)));
    }

    #[test]
    fn the_budget_is_a_share_of_recent_reads() {
        let h = Hedging::new(Some(HedgePolicy::new().with_max_percent(10)));
        let mut taken = 0;
        for _ in 0..1_000 {
            h.plan(OpClass::Read, Endpoint::Sql, None);
            taken += u32::from(h.take());
        }
        assert_eq!(taken, 100);
        assert_eq!(h.sent(), 100);
        // Saved up while not needed, at most ten.
        for _ in 0..1_000 {
            h.plan(OpClass::Read, Endpoint::Sql, None);
        }
        let burst = (0..100).filter(|_| h.take()).count();
        assert_eq!(burst, 10);
    }
}
