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
use crate::retry::classify::OpClass;
use crate::retry::cost::Cause;
use crate::retry::rate::AdaptiveRate;

/// A turn reserved with the adaptive rate, given back when dropped unless it was spent: a call
/// cancelled, refused or dropped (`tokio::time::timeout`, `select!`) while it waited does not
/// keep its place in the queue.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    rate: Option<&'a AdaptiveRate>,
    /// The turn was further away than the call may wait for one (and was given back at once).
    too_far: bool,
}

impl Turn<'_> {
    const NONE: Turn<'static> = Turn {
        rate: None,
        too_far: false,
    };

    /// The attempt went out on this turn: it is not given back.
    pub(crate) fn spend(mut self) {
        self.rate = None;
    }

    /// Whether the turn was further away than the call may wait for one.
    pub(crate) fn is_too_far(&self) -> bool {
        self.too_far
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(rate) = self.rate.take() {
            rate.release();
        }
    }
}

/// A retry paid for: what it cost, and its turn of the adaptive rate; both given back if the
/// retry is not made ([`Transport::unpay`]), the turn also when the call is dropped meanwhile.
#[derive(Debug)]
pub(crate) struct Paid<'a> {
    cost: u32,
    turn: Turn<'a>,
}

impl Paid<'_> {
    /// The retry went out: its turn is used.
    pub(crate) fn spend(self) {
        self.turn.spend();
    }
}

/// Whether the adaptive rate paces a call of this class: not a transaction's steps, which the
/// server holds locks and an idle timeout for (an open transaction is let through to its end).
fn paced(class: OpClass) -> bool {
    class != OpClass::Step
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

    /// Waits for the first attempt's turn under the adaptive rate, if it is on and limiting (never
    /// for a transaction's step): at once when there is a token; an error without sending when
    /// the turn is past `deadline` or more than `max_wait` away
    /// ([`ErrorKind::ClientRateLimited`]), or the call is cancelled meanwhile. A call dropped
    /// while it waits gives its turn back.
    pub(crate) async fn first_turn(
        &self,
        cancel: Option<&CancellationToken>,
        deadline: Option<Instant>,
        class: OpClass,
        max_wait: Duration,
    ) -> Result<()> {
        let Some(rate) = self.rate.as_ref().filter(|_| paced(class)) else {
            return Ok(());
        };
        let wait = rate.acquire();
        let turn = Turn {
            rate: Some(rate),
            too_far: false,
        };
        if wait.is_zero() {
            turn.spend();
            return Ok(());
        }
        if wait > max_wait || past(deadline, wait) {
            drop(turn);
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
                drop(turn);
                Err(Error::new(ErrorKind::Cancelled))
            }
            () = tokio::time::sleep(wait) => {
                turn.spend();
                Ok(())
            }
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

    /// The wait before a retry: the backoff `delay`, or longer when the adaptive rate gives the
    /// retry a later turn (never for a transaction's step). The turn is reserved and given back
    /// when dropped unless spent; one more than `max_wait` away is given back at once and
    /// [`Turn::is_too_far`] says so.
    pub(crate) fn retry_wait(
        &self,
        delay: Duration,
        class: OpClass,
        max_wait: Duration,
    ) -> (Duration, Turn<'_>) {
        let Some(rate) = self.rate.as_ref().filter(|_| paced(class)) else {
            return (delay, Turn::NONE);
        };
        let wait = rate.acquire();
        let turn = Turn {
            rate: Some(rate),
            too_far: false,
        };
        if wait > max_wait {
            drop(turn);
            let refused = Turn {
                rate: None,
                too_far: true,
            };
            return (delay.max(wait), refused);
        }
        (delay.max(wait), turn)
    }

    /// Pays for a retry after `kind` from the budget, by its cause. `Err` with the client's retry
    /// state when the bucket cannot pay (the rate's turn is given back).
    pub(crate) fn pay<'a>(&self, kind: &ErrorKind, turn: Turn<'a>) -> Result<Paid<'a>, RetryState> {
        let cost = self
            .budget
            .as_ref()
            .map_or(0, |bucket| Cause::of(kind).cost(&bucket.settings()));
        if let Some(bucket) = &self.budget
            && !bucket.withdraw(cost)
        {
            drop(turn);
            return Err(self.retry_state());
        }
        Ok(Paid { cost, turn })
    }

    /// Gives back a retry paid for and not made: its tokens and its turn.
    pub(crate) fn unpay(&self, paid: Paid<'_>) {
        if let Some(bucket) = &self.budget {
            bucket.refund(paid.cost);
        }
        drop(paid.turn);
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
