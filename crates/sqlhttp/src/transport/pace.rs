//! The attempt loop's dealings with the client's load controls: the wait the adaptive send rate
//! puts before a call's first attempt, what a retry costs the budget by its cause, and the
//! [`RetryState`] snapshot an application or a refused call's error reads.
//!
//! The rules themselves live in `retry` (`cost`, `rate`, the budget); this file only applies them
//! to one call. It knows nothing of HTTP, bodies or bookmarks.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Transport, cancelled};
use crate::RetryState;
use crate::error::{Error, ErrorKind, Result};
use crate::retry::cost::Cause;

/// A retry paid for: what it cost and whether it holds a turn of the adaptive rate, to give back
/// if the retry is not made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paid {
    cost: u32,
    turn: bool,
}

impl Transport {
    /// What the client's budget and adaptive rate allow now.
    pub(crate) fn retry_state(&self) -> RetryState {
        RetryState {
            budget: self
                .budget
                .as_ref()
                .map(|bucket| (bucket.tokens(), bucket.settings().capacity())),
            send_rate: self.rate.as_ref().and_then(|rate| rate.send_rate()),
            hedges_sent: self.hedging.sent(),
        }
    }

    /// Waits for the first attempt's turn under the adaptive rate, if it is on and limiting: at
    /// once when there is a token; an error without sending when the turn is past `deadline`
    /// ([`ErrorKind::ClientRateLimited`]) or the call is cancelled meanwhile.
    pub(crate) async fn first_turn(
        &self,
        cancel: Option<&CancellationToken>,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        let wait = rate.acquire();
        if wait.is_zero() {
            return Ok(());
        }
        if past(deadline, wait) {
            rate.release();
            tracing::debug!(
                wait_ms = millis(wait),
                "the adaptive send rate holds the call past max_elapsed"
            );
            return Err(Error::new(ErrorKind::ClientRateLimited { wait })
                .with_retry_state(self.retry_state()));
        }
        tracing::debug!(wait_ms = millis(wait), "waiting for the adaptive send rate");
        tokio::select! {
            biased;
            () = cancelled(cancel, self.cancel.as_ref()) => {
                rate.release();
                Err(Error::new(ErrorKind::Cancelled))
            }
            () = tokio::time::sleep(wait) => Ok(()),
        }
    }

    /// Tells the adaptive rate of an attempt's answer (a cancellation is no answer).
    pub(crate) fn observe_answer(&self, failure: Option<&ErrorKind>) {
        if let Some(rate) = &self.rate
            && failure != Some(&ErrorKind::Cancelled)
        {
            rate.observe(failure.is_some_and(Cause::slows_the_rate));
        }
    }

    /// The wait before a retry after `kind`: the backoff `delay`, or longer when the adaptive rate
    /// gives the retry a later turn. The turn is taken; give it back with [`unpay`](Self::unpay)
    /// (or let [`pay`](Self::pay) do so) if the retry is not made.
    pub(crate) fn retry_wait(&self, delay: Duration) -> (Duration, bool) {
        match &self.rate {
            Some(rate) => (delay.max(rate.acquire()), true),
            None => (delay, false),
        }
    }

    /// Pays for a retry after `kind` from the budget, by its cause. `Err` with the client's retry
    /// state when the bucket cannot pay (the rate's turn is given back).
    pub(crate) fn pay(&self, kind: &ErrorKind, turn: bool) -> Result<Paid, RetryState> {
        let cost = self
            .budget
            .as_ref()
            .map_or(0, |bucket| Cause::of(kind).cost(&bucket.settings()));
        if let Some(bucket) = &self.budget
            && !bucket.withdraw(cost)
        {
            self.unpay(Paid { cost: 0, turn });
            return Err(self.retry_state());
        }
        Ok(Paid { cost, turn })
    }

    /// Gives back a retry paid for and not made: its tokens and its turn.
    pub(crate) fn unpay(&self, paid: Paid) {
        if let Some(bucket) = &self.budget {
            bucket.refund(paid.cost);
        }
        if paid.turn
            && let Some(rate) = &self.rate
        {
            rate.release();
        }
    }

    /// Gives back a turn of the adaptive rate taken for a retry that will not be made.
    pub(crate) fn release_turn(&self, turn: bool) {
        self.unpay(Paid { cost: 0, turn });
    }
}

/// Whether a wait from now ends at or past `deadline`.
fn past(deadline: Option<Instant>, wait: Duration) -> bool {
    deadline.is_some_and(|deadline| {
        Instant::now()
            .checked_add(wait)
            .is_none_or(|wakes| wakes >= deadline)
    })
}

fn millis(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
}
