//! Rate limiting: a token bucket (GCRA, from the `governor` crate) per credential, or per client
//! address for anonymous requests. Over it a request is answered `429 RATE_LIMITED` with
//! `Retry-After` in whole seconds, rounded up and never 0, so a client that honours it is let in.
//!
//! Knows keys, a clock and the refusal's shape; nothing about tokens, SQL or the engine. Idle
//! buckets (full again, so indistinguishable from new ones) are pruned every few thousand
//! checks, so a stream of new client addresses cannot grow memory without bound.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use governor::Quota;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;

use crate::config::RateLimit;
use crate::http::credentials::Label;
use crate::protocol::error::{ApiError, ErrorCode};

/// Checks between two prunings of idle buckets.
const PRUNE_EVERY: u64 = 4096;

/// Whose bucket a request spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// A configured token's, wherever it calls from.
    Credential(Label),
    /// An address's: anonymous requests, and requests whose token was refused. `None` when the
    /// address is unknown (a request handed to the app in-process).
    Address(Option<IpAddr>),
}

/// The buckets of every key, over a clock (the real one outside tests).
pub(crate) struct RateLimiter<C: Clock = DefaultClock> {
    buckets: governor::RateLimiter<Key, DefaultKeyedStateStore<Key>, C, NoOpMiddleware<C::Instant>>,
    limit: RateLimit,
    checks: AtomicU64,
}

impl<C: Clock> std::fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    pub(crate) fn new(limit: RateLimit) -> RateLimiter {
        RateLimiter::with_clock(limit, DefaultClock::default())
    }
}

impl<C: Clock> RateLimiter<C> {
    pub(crate) fn with_clock(limit: RateLimit, clock: C) -> RateLimiter<C> {
        let quota = Quota::per_second(limit.per_second).allow_burst(limit.burst);
        RateLimiter {
            buckets: governor::RateLimiter::new(quota, DefaultKeyedStateStore::default(), clock),
            limit,
            checks: AtomicU64::new(0),
        }
    }

    /// Spends one request from `key`'s bucket, or says how long until it holds one.
    pub(crate) fn check(&self, key: &Key) -> Result<(), RateLimited> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY == PRUNE_EVERY - 1 {
            self.buckets.retain_recent();
            self.buckets.shrink_to_fit();
        }
        self.buckets.check_key(key).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.buckets.clock().now());
            RateLimited {
                retry_after: retry_after_secs(wait),
                limit: self.limit,
            }
        })
    }

    #[cfg(test)]
    fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least 1 (a `0` would invite the
/// client straight back before its bucket holds a request).
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// A refused request: `429 RATE_LIMITED` with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimited {
    pub(crate) retry_after: u64,
    limit: RateLimit,
}

impl IntoResponse for RateLimited {
    fn into_response(self) -> Response {
        let message = format!(
            "rate limit exceeded: this server allows {} requests a second per credential \
             (bursts of {}); retry after {} s",
            self.limit.per_second, self.limit.burst, self.retry_after
        );
        let mut response = ApiError::new(ErrorCode::RateLimited, message).into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(self.retry_after));
        response
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use governor::clock::FakeRelativeClock;

    use super::*;

    fn limit(per_second: u32, burst: u32) -> RateLimit {
        RateLimit {
            per_second: NonZeroU32::new(per_second).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(999)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2500)), 3);
    }

    #[test]
    fn a_bucket_lets_its_burst_through_then_refills_at_the_rate() {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::with_clock(limit(2, 3), clock.clone());
        let token = Key::Credential(Label::Token(1));
        for _ in 0..3 {
            limiter.check(&token).unwrap();
        }
        let refused = limiter.check(&token).unwrap_err();
        assert_eq!(refused.retry_after, 1, "half a second, rounded up");
        clock.advance(Duration::from_millis(499));
        assert!(limiter.check(&token).is_err());
        clock.advance(Duration::from_millis(1));
        limiter.check(&token).unwrap();
        assert!(limiter.check(&token).is_err());
        // A quiet spell refills the bucket to its burst, not beyond.
        clock.advance(Duration::from_secs(60));
        for _ in 0..3 {
            limiter.check(&token).unwrap();
        }
        assert!(limiter.check(&token).is_err());
    }

    #[test]
    fn buckets_are_per_key() {
        let limiter = RateLimiter::with_clock(limit(1, 1), FakeRelativeClock::default());
        let keys = [
            Key::Credential(Label::Token(1)),
            Key::Credential(Label::Read(1)),
            Key::Address(Some("10.0.0.1".parse().unwrap())),
            Key::Address(Some("10.0.0.2".parse().unwrap())),
            Key::Address(None),
        ];
        for key in &keys {
            limiter.check(key).unwrap();
        }
        for key in &keys {
            assert!(limiter.check(key).is_err(), "{key:?}");
        }
    }

    #[test]
    fn a_slow_rate_asks_for_a_longer_wait() {
        let limiter = RateLimiter::with_clock(limit(1, 1), FakeRelativeClock::default());
        let key = Key::Address(None);
        limiter.check(&key).unwrap();
        assert_eq!(limiter.check(&key).unwrap_err().retry_after, 1);
    }

    #[test]
    fn idle_buckets_are_pruned() {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::with_clock(limit(1000, 1), clock.clone());
        for n in 0..PRUNE_EVERY - 1 {
            let ip = IpAddr::from(u32::try_from(n).unwrap().to_be_bytes());
            limiter.check(&Key::Address(Some(ip))).unwrap();
        }
        assert_eq!(limiter.buckets(), usize::try_from(PRUNE_EVERY - 1).unwrap());
        clock.advance(Duration::from_secs(1));
        limiter.check(&Key::Address(None)).unwrap();
        assert!(limiter.buckets() <= 1, "{}", limiter.buckets());
    }

    #[test]
    fn the_refusal_is_a_429_with_retry_after() {
        let response = RateLimited {
            retry_after: 3,
            limit: limit(5, 10),
        }
        .into_response();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    }
}
