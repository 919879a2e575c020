//! The interactive-transaction bodies the server writes: an open's answer ([`opened`]), a
//! commit's ([`committed`]) and how a transaction stands ([`outcome`]), each a type of the
//! `sqlhttp_protocol` crate (`TransactionOpened`, `TransactionOutcome`), and the [`Isolation`]
//! levels a transaction opens with (ADR 0048).
//!
//! Pure functions over bytes: nothing here knows HTTP, the registry of transactions
//! (`crate::transactions`) or either engine.

use std::time::Duration;

use sqlhttp_protocol::body::{TransactionOpened, TransactionOutcome};

use crate::protocol::bookmark::ServedBy;
use crate::protocol::error::ApiError;

/// A transaction's isolation level, as the client asks for it: the protocol's (ADR 0048).
pub(crate) use sqlhttp_protocol::Isolation;
/// How a transaction stands or ended, as the protocol names it.
pub(crate) use sqlhttp_protocol::body::Outcome;

/// `{"outcome": name}`: the protocol's `TransactionOutcome` without `stats`.
pub(crate) fn outcome(outcome: Outcome) -> Vec<u8> {
    // Serializing one enum into a Vec cannot fail.
    serde_json::to_vec(&TransactionOutcome {
        outcome,
        stats: None,
    })
    .unwrap_or_default()
}

/// `{"outcome":"committed","stats":{...}}`: a commit's answer, with what its COMMIT took
/// (`duration_ms` written as every statement's stats are, by `protocol::result::stats`).
pub(crate) fn committed(took: Duration) -> Vec<u8> {
    let mut body = br#"{"outcome":"committed""#.to_vec();
    crate::protocol::result::stats(&mut body, took, None, None, ServedBy::Primary);
    body.push(b'}');
    body
}

/// An open's answer: the protocol's `TransactionOpened`.
pub(crate) fn opened(
    token: &str,
    read_only: bool,
    isolation: Isolation,
    idle_timeout: Duration,
    max_lifetime: Duration,
) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(&TransactionOpened {
        transaction: token,
        read_only,
        isolation,
        idle_timeout_ms: millis(idle_timeout),
        max_lifetime_ms: millis(max_lifetime),
    })
    .map_err(|_| ApiError::internal())
}

/// `duration` in whole milliseconds, saturated at `i64::MAX` (as the idempotency store's times
/// are).
fn millis(duration: Duration) -> u64 {
    i64::try_from(duration.as_millis())
        .unwrap_or(i64::MAX)
        .unsigned_abs()
}
