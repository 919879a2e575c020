//! The client-wide retry budget: a token bucket that every clone of a `Client` shares.
//!
//! A retry withdraws tokens (one after a throttle costs less than one after a failure: see
//! `cost`); a success deposits a little back. When the bucket cannot pay for a retry, the failure is
//! returned as it is. The bucket knows nothing of HTTP or of attempts; the loop decides what to pay.

use std::sync::atomic::{AtomicU32, Ordering};

/// Settings of the retry budget (see the [`retry`](crate::retry) module for why there is one).
///
/// # Defaults
///
/// The AWS SDKs' retry figures of November 2026 (ADR 0054): capacity 500; a retry after a throttle
/// (`429`, a `503` with `Retry-After`, `409 IDEMPOTENCY_KEY_IN_USE`) costs 5, one after a failure
/// (a lost connection, a `5xx`) 14, one after a timeout 14; each success deposits 1. A full bucket
/// pays for 35 retries after failures, or 100 after throttles; once an outage has drained it, about
/// one call in fourteen may retry.
///
/// | setting | default |
/// |---|---|
/// | [`with_capacity`](Self::with_capacity) | 500 |
/// | [`with_throttle_cost`](Self::with_throttle_cost) | 5 |
/// | [`with_retry_cost`](Self::with_retry_cost) | 14 |
/// | [`with_timeout_cost`](Self::with_timeout_cost) | 14 |
/// | [`with_success_deposit`](Self::with_success_deposit) | 1 |
///
/// ```
/// use sqlhttp::RetryBudget;
/// let budget = RetryBudget::new().with_capacity(1_000).with_retry_cost(2);
/// assert_eq!(budget.capacity(), 1_000);
/// assert_eq!(budget.throttle_cost(), 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    capacity: u32,
    throttle_cost: u32,
    retry_cost: u32,
    timeout_cost: u32,
    success_deposit: u32,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudget {
    /// The default budget.
    pub const fn new() -> Self {
        Self {
            capacity: 500,
            throttle_cost: 5,
            retry_cost: 14,
            timeout_cost: 14,
            success_deposit: 1,
        }
    }

    /// Tokens the bucket holds when full (and when the client is built).
    #[must_use]
    pub const fn with_capacity(mut self, tokens: u32) -> Self {
        self.capacity = tokens;
        self
    }

    /// Tokens withdrawn for a retry after a throttle: a `429`, a `503` with `Retry-After`, a `409
    /// IDEMPOTENCY_KEY_IN_USE`.
    #[must_use]
    pub const fn with_throttle_cost(mut self, tokens: u32) -> Self {
        self.throttle_cost = tokens;
        self
    }

    /// Tokens withdrawn for a retry after a failure: a lost connection, a `5xx` without
    /// `Retry-After`, a `408`.
    #[must_use]
    pub const fn with_retry_cost(mut self, tokens: u32) -> Self {
        self.retry_cost = tokens;
        self
    }

    /// Tokens withdrawn for a retry after an attempt timed out.
    #[must_use]
    pub const fn with_timeout_cost(mut self, tokens: u32) -> Self {
        self.timeout_cost = tokens;
        self
    }

    /// Tokens deposited by each successful call.
    #[must_use]
    pub const fn with_success_deposit(mut self, tokens: u32) -> Self {
        self.success_deposit = tokens;
        self
    }

    // Getters

    /// Tokens the bucket holds when full.
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Tokens withdrawn for a retry after a throttle.
    pub const fn throttle_cost(&self) -> u32 {
        self.throttle_cost
    }

    /// Tokens withdrawn for a retry after a failure.
    pub const fn retry_cost(&self) -> u32 {
        self.retry_cost
    }

    /// Tokens withdrawn for a retry after an attempt timed out.
    pub const fn timeout_cost(&self) -> u32 {
        self.timeout_cost
    }

    /// Tokens deposited by each successful call.
    pub const fn success_deposit(&self) -> u32 {
        self.success_deposit
    }
}

/// The running bucket.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    settings: RetryBudget,
    tokens: AtomicU32,
}

impl TokenBucket {
    pub(crate) fn new(settings: RetryBudget) -> Self {
        Self {
            settings,
            tokens: AtomicU32::new(settings.capacity),
        }
    }

    /// The settings the bucket runs on.
    pub(crate) fn settings(&self) -> RetryBudget {
        self.settings
    }

    /// Takes `cost` tokens, the price of one retry, or returns `false` (taking nothing) when the
    /// bucket cannot pay.
    pub(crate) fn withdraw(&self, cost: u32) -> bool {
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(cost))
            .is_ok()
    }

    /// Gives back the price of a retry that was paid for but not made (the call was cancelled).
    pub(crate) fn refund(&self, cost: u32) {
        self.add(cost);
    }

    /// Returns a little to the bucket after a success, up to its capacity.
    pub(crate) fn deposit(&self) {
        self.add(self.settings.success_deposit);
    }

    fn add(&self, tokens: u32) {
        let cap = self.settings.capacity;
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(tokens).min(cap))
            });
    }

    /// Tokens left now.
    pub(crate) fn tokens(&self) -> u32 {
        self.tokens.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_full() {
        assert_eq!(TokenBucket::new(RetryBudget::new()).tokens(), 500);
    }

    #[test]
    fn a_withdrawal_takes_its_cost() {
        let b = TokenBucket::new(RetryBudget::new());
        assert!(b.withdraw(5));
        assert_eq!(b.tokens(), 495);
        assert!(b.withdraw(14));
        assert_eq!(b.tokens(), 481);
    }

    #[test]
    fn empty_bucket_refuses_and_takes_nothing() {
        let b = TokenBucket::new(RetryBudget::new().with_capacity(12));
        assert!(b.withdraw(5));
        assert!(b.withdraw(5));
        assert_eq!(b.tokens(), 2);
        assert!(!b.withdraw(5));
        assert!(!b.withdraw(10));
        assert_eq!(b.tokens(), 2);
    }

    #[test]
    fn successes_refill_up_to_capacity() {
        let b = TokenBucket::new(RetryBudget::new().with_capacity(10));
        assert!(b.withdraw(10));
        assert!(!b.withdraw(10));
        for _ in 0..9 {
            b.deposit();
        }
        assert!(!b.withdraw(10));
        b.deposit();
        assert!(b.withdraw(10));
        for _ in 0..100 {
            b.deposit();
        }
        assert_eq!(b.tokens(), 10);
    }

    #[test]
    fn a_refund_returns_the_price_paid_up_to_capacity() {
        let b = TokenBucket::new(RetryBudget::new().with_capacity(30));
        assert!(b.withdraw(10));
        assert_eq!(b.tokens(), 20);
        b.refund(10);
        assert_eq!(b.tokens(), 30);
        b.refund(5);
        assert_eq!(b.tokens(), 30, "never above capacity");
    }

    #[test]
    fn concurrent_withdrawals_never_overdraw() {
        let b = std::sync::Arc::new(TokenBucket::new(RetryBudget::new().with_capacity(1_000)));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..100).filter(|_| b.withdraw(5)).count())
            })
            .collect();
        let paid: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(paid, 200);
        assert_eq!(b.tokens(), 0);
    }
}
