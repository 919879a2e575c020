//! The client-wide retry budget: a token bucket that every clone of a `Client` shares.
//!
//! A retry withdraws tokens (a timeout costs more than an error, as it held a connection for the whole
//! attempt budget); a success deposits a little back. When the bucket cannot pay for a retry, the failure
//! is returned as it is. The bucket knows nothing of HTTP or of attempts; the loop decides what to pay.

use std::sync::atomic::{AtomicU32, Ordering};

/// Settings of the retry budget (see the [`retry`](crate::retry) module for why there is one).
///
/// # Defaults
///
/// Modelled on the standard retry mode of the AWS SDKs: capacity 500, a retry costs 5, a retry after a
/// timeout costs 10, each success deposits 1. A full bucket pays for 100 retries; once an outage has
/// drained it, about one call in five may retry.
///
/// ```
/// use sqlhttp::RetryBudget;
/// let budget = RetryBudget::new().with_capacity(1_000).with_retry_cost(2);
/// assert_eq!(budget.capacity(), 1_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    capacity: u32,
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
            retry_cost: 5,
            timeout_cost: 10,
            success_deposit: 1,
        }
    }

    /// Tokens the bucket holds when full (and when the client is built).
    #[must_use]
    pub const fn with_capacity(mut self, tokens: u32) -> Self {
        self.capacity = tokens;
        self
    }

    /// Tokens withdrawn for a retry after an error.
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

    /// Tokens withdrawn for a retry after an error.
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

    /// Takes the price of one retry, or returns `false` (taking nothing) when the bucket cannot pay.
    pub(crate) fn withdraw(&self, after_timeout: bool) -> bool {
        let cost = if after_timeout {
            self.settings.timeout_cost
        } else {
            self.settings.retry_cost
        };
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(cost))
            .is_ok()
    }

    /// Gives back the price of a retry that was paid for but not made (the call was cancelled).
    pub(crate) fn refund(&self, after_timeout: bool) {
        let cost = if after_timeout {
            self.settings.timeout_cost
        } else {
            self.settings.retry_cost
        };
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

    #[cfg(test)]
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
    fn a_timeout_costs_more_than_an_error() {
        let b = TokenBucket::new(RetryBudget::new());
        assert!(b.withdraw(false));
        assert_eq!(b.tokens(), 495);
        assert!(b.withdraw(true));
        assert_eq!(b.tokens(), 485);
    }

    #[test]
    fn empty_bucket_refuses_and_takes_nothing() {
        let b = TokenBucket::new(RetryBudget::new().with_capacity(12));
        assert!(b.withdraw(false));
        assert!(b.withdraw(false));
        assert_eq!(b.tokens(), 2);
        assert!(!b.withdraw(false));
        assert!(!b.withdraw(true));
        assert_eq!(b.tokens(), 2);
    }

    #[test]
    fn successes_refill_up_to_capacity() {
        let b = TokenBucket::new(RetryBudget::new().with_capacity(10).with_retry_cost(10));
        assert!(b.withdraw(false));
        assert!(!b.withdraw(false));
        for _ in 0..9 {
            b.deposit();
        }
        assert!(!b.withdraw(false));
        b.deposit();
        assert!(b.withdraw(false));
        for _ in 0..100 {
            b.deposit();
        }
        assert_eq!(b.tokens(), 10);
    }

    #[test]
    fn a_refund_returns_the_price_paid_up_to_capacity() {
        let b = TokenBucket::new(RetryBudget::new().with_capacity(30));
        assert!(b.withdraw(true));
        assert_eq!(b.tokens(), 20);
        b.refund(true);
        assert_eq!(b.tokens(), 30);
        b.refund(false);
        assert_eq!(b.tokens(), 30, "never above capacity");
    }

    #[test]
    fn concurrent_withdrawals_never_overdraw() {
        let b = std::sync::Arc::new(TokenBucket::new(RetryBudget::new().with_capacity(1_000)));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..100).filter(|_| b.withdraw(false)).count())
            })
            .collect();
        let paid: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(paid, 200);
        assert_eq!(b.tokens(), 0);
    }
}
