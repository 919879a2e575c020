//! What a retry costs and how long it waits, by the cause of the failure before it: a throttle (the
//! server said "slow down": `429`, a `503` with `Retry-After`, `409 IDEMPOTENCY_KEY_IN_USE`), an
//! attempt timeout, or any other transient failure (a lost connection, a `5xx`).
//!
//! Pure functions over a failure's kind, the policy and a random source. It knows nothing of HTTP,
//! of the bucket's running state or of the attempt loop, which asks it one question per retry.

use std::time::Duration;

use rand::{Rng, RngExt};

use super::{RetryBudget, RetryPolicy, backoff};
use crate::error::ErrorKind;

/// Why a retry is made, which decides what it costs the budget and its base delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The server is shedding load and said so: `429`, a `503` that names a `Retry-After`, or a
    /// `409 IDEMPOTENCY_KEY_IN_USE` (the first attempt is still running). Nothing failed: a retry
    /// after it is cheap, and waits from [`RetryPolicy::throttle_initial_backoff`].
    Throttle,
    /// An attempt ran out of its timeout: it held a connection for its whole budget.
    Timeout,
    /// Any other transient failure: a lost or refused connection, a `5xx` without `Retry-After`,
    /// `503 OUTCOME_UNKNOWN`, a `408`.
    Failure,
}

impl Cause {
    /// The cause of a transient failure.
    pub(crate) fn of(kind: &ErrorKind) -> Cause {
        match kind {
            ErrorKind::RateLimited { .. }
            | ErrorKind::IdempotencyKeyInUse { .. }
            | ErrorKind::Unavailable {
                retry_after: Some(_),
                ..
            }
            | ErrorKind::Http { status: 429, .. } => Cause::Throttle,
            ErrorKind::Timeout { .. } => Cause::Timeout,
            _ => Cause::Failure,
        }
    }

    /// Whether the client's adaptive rate counts this answer as a throttle: a `429` or a `503`
    /// with `Retry-After`, which speak of the server's load. A key in use speaks of one write
    /// still running, not of load, and is not counted.
    pub(crate) fn slows_the_rate(kind: &ErrorKind) -> bool {
        Cause::of(kind) == Cause::Throttle && !matches!(kind, ErrorKind::IdempotencyKeyInUse { .. })
    }

    /// What a retry after this cause costs under `budget`.
    pub(crate) fn cost(self, budget: &RetryBudget) -> u32 {
        match self {
            Cause::Throttle => budget.throttle_cost(),
            Cause::Timeout => budget.timeout_cost(),
            Cause::Failure => budget.retry_cost(),
        }
    }

    /// The base of the exponential backoff after this cause.
    fn initial_backoff(self, policy: &RetryPolicy) -> Duration {
        match self {
            Cause::Throttle => policy.throttle_initial_backoff,
            Cause::Timeout | Cause::Failure => policy.initial_backoff,
        }
    }
}

/// The server's wait, when the failure carried a valid `Retry-After`.
fn server_wait(kind: &ErrorKind) -> Option<Duration> {
    match kind {
        ErrorKind::RateLimited { retry_after, .. }
        | ErrorKind::Unavailable { retry_after, .. }
        | ErrorKind::OutcomeUnknown { retry_after, .. }
        | ErrorKind::IdempotencyKeyInUse { retry_after, .. } => *retry_after,
        _ => None,
    }
}

/// The delay before retry number `retry` (1 for the first) after `kind`: the computed backoff from
/// the cause's base (jittered, capped by `max_backoff`), or the server's `Retry-After` when it gave
/// one, honoured up to that computed delay plus [`RetryPolicy::retry_after_max_extra`]. Under
/// [`Jitter::Full`](super::Jitter::Full) a tenth of the server's wait is added at random on top,
/// so that clients told the same `Retry-After` at once do not all come back in the same instant.
pub(crate) fn delay_before_retry<R: Rng + ?Sized>(
    policy: &RetryPolicy,
    retry: u32,
    kind: &ErrorKind,
    rng: &mut R,
) -> Duration {
    let base = Cause::of(kind).initial_backoff(policy);
    let computed = backoff::delay(&policy.with_initial_backoff(base), retry, rng);
    match server_wait(kind) {
        Some(wait) => {
            let spread = match policy.jitter {
                super::Jitter::None => Duration::ZERO,
                super::Jitter::Full => {
                    let tenth = u64::try_from((wait / 10).as_nanos()).unwrap_or(u64::MAX);
                    Duration::from_nanos(rng.random_range(0..=tenth))
                }
            };
            wait.saturating_add(spread)
                .min(computed.saturating_add(policy.retry_after_max_extra))
        }
        None => computed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::Jitter;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn rate_limited(secs: Option<u64>) -> ErrorKind {
        ErrorKind::RateLimited {
            retry_after: secs.map(Duration::from_secs),
            message: String::new(),
        }
    }

    fn unavailable(secs: Option<u64>) -> ErrorKind {
        ErrorKind::Unavailable {
            retry_after: secs.map(Duration::from_secs),
            message: String::new(),
        }
    }

    /// Every cause the issue names, row by row: (failure, cause, slows the adaptive rate).
    #[test]
    fn each_failure_has_its_cause() {
        let rows = [
            (rate_limited(None), Cause::Throttle, true),
            (rate_limited(Some(2)), Cause::Throttle, true),
            (unavailable(Some(1)), Cause::Throttle, true),
            (unavailable(None), Cause::Failure, false),
            (
                ErrorKind::IdempotencyKeyInUse {
                    retry_after: None,
                    message: String::new(),
                },
                Cause::Throttle,
                false,
            ),
            (
                ErrorKind::OutcomeUnknown {
                    retry_after: Some(Duration::from_secs(1)),
                    message: String::new(),
                },
                Cause::Failure,
                false,
            ),
            (
                ErrorKind::Http {
                    status: 429,
                    code: None,
                    message: String::new(),
                },
                Cause::Throttle,
                true,
            ),
            (
                ErrorKind::Http {
                    status: 502,
                    code: None,
                    message: String::new(),
                },
                Cause::Failure,
                false,
            ),
            (
                ErrorKind::Connection {
                    message: "reset".into(),
                },
                Cause::Failure,
                false,
            ),
            (ErrorKind::Timeout { after: ms(5) }, Cause::Timeout, false),
        ];
        for (kind, cause, slows) in rows {
            assert_eq!(Cause::of(&kind), cause, "{kind:?}");
            assert_eq!(Cause::slows_the_rate(&kind), slows, "{kind:?}");
        }
    }

    #[test]
    fn a_throttle_costs_less_than_a_failure() {
        let budget = RetryBudget::new();
        assert_eq!(Cause::Throttle.cost(&budget), 5);
        assert_eq!(Cause::Failure.cost(&budget), 14);
        assert_eq!(Cause::Timeout.cost(&budget), 14);
        let custom = budget
            .with_throttle_cost(1)
            .with_retry_cost(2)
            .with_timeout_cost(3);
        assert_eq!(
            [Cause::Throttle, Cause::Failure, Cause::Timeout].map(|c| c.cost(&custom)),
            [1, 2, 3]
        );
    }

    #[test]
    fn each_cause_backs_off_from_its_own_base() {
        let policy = RetryPolicy::new().with_jitter(Jitter::None);
        let mut rng = StdRng::seed_from_u64(1);
        let failure = ErrorKind::Connection {
            message: String::new(),
        };
        let delays = |kind: &ErrorKind, rng: &mut StdRng| {
            (1..=4)
                .map(|n| delay_before_retry(&policy, n, kind, rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            delays(&failure, &mut rng),
            [ms(100), ms(200), ms(400), ms(800)]
        );
        assert_eq!(
            delays(&rate_limited(None), &mut rng),
            [ms(1_000), ms(2_000), ms(4_000), ms(5_000)],
            "from 1 s, capped by max_backoff"
        );
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_computed_delay_plus_the_extra() {
        let policy = RetryPolicy::new().with_jitter(Jitter::None);
        let mut rng = StdRng::seed_from_u64(1);
        // Throttle base 1 s: the first retry's computed delay is 1 s, so up to 6 s is honoured.
        assert_eq!(
            delay_before_retry(&policy, 1, &rate_limited(Some(3)), &mut rng),
            ms(3_000)
        );
        assert_eq!(
            delay_before_retry(&policy, 1, &rate_limited(Some(30)), &mut rng),
            ms(6_000)
        );
        assert_eq!(
            delay_before_retry(&policy, 1, &rate_limited(Some(0)), &mut rng),
            ms(0),
            "the server may ask for less than the computed delay"
        );
        // A third retry computes 4 s: up to 9 s.
        assert_eq!(
            delay_before_retry(&policy, 3, &unavailable(Some(30)), &mut rng),
            ms(9_000)
        );
        let tight = policy.with_retry_after_max_extra(Duration::ZERO);
        assert_eq!(
            delay_before_retry(&tight, 1, &rate_limited(Some(30)), &mut rng),
            ms(1_000)
        );
    }

    #[test]
    fn a_server_s_wait_is_spread_by_up_to_a_tenth_under_full_jitter() {
        let policy = RetryPolicy::new();
        let mut rng = StdRng::seed_from_u64(4);
        let waits: Vec<_> = (0..200)
            .map(|_| delay_before_retry(&policy, 1, &rate_limited(Some(2)), &mut rng))
            .collect();
        assert!(
            waits.iter().all(|w| *w >= ms(2_000) && *w <= ms(2_200)),
            "{waits:?}"
        );
        let distinct: std::collections::HashSet<_> = waits.iter().collect();
        assert!(distinct.len() > 150, "spread, not in lockstep");
        assert_eq!(
            delay_before_retry(&policy, 1, &rate_limited(Some(0)), &mut rng),
            Duration::ZERO,
            "at once stays at once"
        );
    }

    #[test]
    fn jittered_delays_repeat_with_the_seed_and_stay_under_the_cause_s_ceiling() {
        let policy = RetryPolicy::new();
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (1..=5)
                .map(|n| delay_before_retry(&policy, n, &rate_limited(None), &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(9), run(9));
        for (n, delay) in run(9).into_iter().enumerate() {
            let ceiling = ms(1_000 << n).min(ms(5_000));
            assert!(delay <= ceiling, "retry {}: {delay:?}", n + 1);
        }
    }
}
