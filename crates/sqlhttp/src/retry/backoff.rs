//! The computed delay between attempts: exponential, capped, jittered.
//!
//! Pure arithmetic over a policy and a random source; it knows nothing of HTTP or of `Retry-After`.

use std::time::Duration;

use rand::{Rng, RngExt};

use super::RetryPolicy;

/// How the computed backoff is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// Uniform in `[0, capped exponential]` ("full jitter"): clients that failed together spread out.
    #[default]
    Full,
    /// Exactly the capped exponential. Only for callers that jitter elsewhere.
    None,
}

/// The ceiling of the delay before retry number `retry` (1 for the first retry):
/// `min(max_backoff, initial_backoff * 2^(retry-1))`, without overflow.
pub(crate) fn ceiling(policy: &RetryPolicy, retry: u32) -> Duration {
    let doublings = retry.saturating_sub(1).min(63);
    let factor = 1u64 << doublings;
    let nanos = policy
        .initial_backoff
        .as_nanos()
        .saturating_mul(u128::from(factor));
    let max = policy.max_backoff.as_nanos();
    Duration::from_nanos(u64::try_from(nanos.min(max)).unwrap_or(u64::MAX))
}

/// The delay before retry number `retry`, drawn from `rng` under the policy's jitter.
pub(crate) fn delay<R: Rng + ?Sized>(policy: &RetryPolicy, retry: u32, rng: &mut R) -> Duration {
    let ceiling = ceiling(policy, retry);
    match policy.jitter {
        Jitter::None => ceiling,
        Jitter::Full => {
            let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(rng.random_range(0..=nanos))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn policy(initial_ms: u64, max_ms: u64) -> RetryPolicy {
        RetryPolicy::new()
            .with_initial_backoff(Duration::from_millis(initial_ms))
            .with_max_backoff(Duration::from_millis(max_ms))
    }

    #[test]
    fn ceiling_doubles_from_initial() {
        let p = policy(100, 60_000);
        let got: Vec<_> = (1..=5).map(|n| ceiling(&p, n).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1600]);
    }

    #[test]
    fn ceiling_is_capped_by_max_backoff() {
        let p = policy(100, 5_000);
        assert_eq!(ceiling(&p, 7), Duration::from_millis(5_000));
        assert_eq!(ceiling(&p, 1_000), Duration::from_millis(5_000));
    }

    #[test]
    fn ceiling_never_overflows() {
        let p = RetryPolicy::new()
            .with_initial_backoff(Duration::from_secs(u64::MAX / 4))
            .with_max_backoff(Duration::MAX);
        assert!(ceiling(&p, u32::MAX) > Duration::ZERO);
    }

    #[test]
    fn no_jitter_is_the_ceiling() {
        let p = policy(100, 5_000).with_jitter(Jitter::None);
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(delay(&p, 3, &mut rng), Duration::from_millis(400));
    }

    #[test]
    fn full_jitter_spreads_delays() {
        let p = policy(1_000, 1_000);
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<_> = (0..50).map(|_| delay(&p, 1, &mut rng)).collect();
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(
            distinct.len() > 40,
            "full jitter should rarely repeat: {distinct:?}"
        );
        assert!(delays.iter().any(|d| *d < Duration::from_millis(500)));
        assert!(delays.iter().any(|d| *d > Duration::from_millis(500)));
    }

    #[test]
    fn same_seed_same_delays() {
        let p = policy(100, 5_000);
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (1..=6).map(|n| delay(&p, n, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn zero_initial_backoff_means_no_wait() {
        let p = policy(0, 0);
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(delay(&p, 4, &mut rng), Duration::ZERO);
    }

    proptest! {
        #[test]
        fn delay_lies_within_the_capped_exponential(
            initial_ms in 0u64..10_000,
            extra_ms in 0u64..100_000,
            retry in 1u32..80,
            seed in any::<u64>(),
        ) {
            let p = policy(initial_ms, initial_ms + extra_ms);
            let mut rng = StdRng::seed_from_u64(seed);
            let d = delay(&p, retry, &mut rng);
            let exp = Duration::from_millis(initial_ms).saturating_mul(1u32 << (retry - 1).min(31));
            let bound = exp.min(Duration::from_millis(initial_ms + extra_ms));
            prop_assert!(d <= bound, "{d:?} > {bound:?}");
        }
    }
}
