//! The exactly-once rule, once for both engines: what a stored outcome means for a keyed
//! request ([`decide`]: replay it, refuse a different request with the same key, or run), what
//! a run's result means for the outcome stored with its effects ([`settle`]), and how often
//! expired keys are purged ([`PurgeClock`]).
//!
//! Each engine's own `keyed` module stores outcomes in its database, in the same transaction as
//! the work, and calls these. Knows the protocol's error codes and clock arithmetic; nothing
//! about SQL, HTTP, or either engine.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::engine::Outcome;
use crate::protocol::error::{ApiError, ErrorCode};

/// Expired keys are purged at most this often (and looked past on every lookup).
pub(crate) const PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// An outcome as an engine stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// The identity of the request that produced it.
    pub(crate) request_hash: Vec<u8>,
    /// Its HTTP status.
    pub(crate) status: u16,
    /// Its JSON body.
    pub(crate) body: Vec<u8>,
    /// When it was stored, in milliseconds since the epoch ([`now_millis`]).
    pub(crate) created_at: i64,
    /// Where the database's log stood when it was read, at or past the commit that stored it
    /// (PostgreSQL, where a lookup reads it: a bookmark for an answer built from it).
    pub(crate) position: Option<crate::protocol::bookmark::Bookmark>,
}

/// What to do with a keyed request, given what is stored under its key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The same request ran within the TTL: answer its outcome again.
    Replay(Outcome),
    /// Nothing is stored, or only an expired outcome (`expired`: the engine deletes it, or lets
    /// the new outcome replace it): run the work.
    Run {
        /// An expired outcome is stored under the key.
        expired: bool,
    },
}

/// Decides on a keyed request of `request_hash` with `stored` under its key; a different
/// request under a live key is `422 IDEMPOTENCY_KEY_REUSED`.
pub(crate) fn decide(
    stored: Option<Stored>,
    request_hash: &[u8],
    ttl: Duration,
) -> Result<Decision, ApiError> {
    let Some(stored) = stored else {
        return Ok(Decision::Run { expired: false });
    };
    if now_millis().saturating_sub(stored.created_at) >= millis(ttl) {
        return Ok(Decision::Run { expired: true });
    }
    if stored.request_hash != request_hash {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            "this Idempotency-Key was already used with a different request body",
        ));
    }
    // A replay is held against the server's budget like the answer it repeats (`503` when the
    // budget cannot: nothing runs for a replay, so a retry loses nothing).
    crate::engine::grow_to(stored.body.len(), false)?;
    Ok(Decision::Replay(Outcome {
        status: stored.status,
        body: stored.body,
        replayed: true,
        position: None,
    }))
}

/// What a run of keyed work leaves to store with its effects.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The work succeeded: its `200` body is stored with its effects.
    Succeeded(Vec<u8>),
    /// The work failed with a final verdict (a SQL error, a constraint, the sandbox): whatever
    /// part of it ran is undone first, then this status and body are stored, so a retry gets
    /// the same verdict without running again.
    Refused(u16, Vec<u8>),
}

impl Settled {
    /// The status and body to store.
    pub(crate) fn into_parts(self) -> (u16, Vec<u8>) {
        match self {
            Settled::Succeeded(body) => (200, body),
            Settled::Refused(status, body) => (status, body),
        }
    }
}

/// Settles a run's `result`. Any other failure (a timeout, an oversized result, the engine
/// closing: they depend on load, not on the request) is handed back, to roll back with
/// nothing stored, so a retry runs the work again.
///
/// The outcome to store must fit the buffered job's share of the server's budget, grown for it
/// here, before anything commits (`engine::grow_to`): when it cannot, the run is handed back as
/// `503`, rolled back and not stored, so the answer of a work that commits is always held.
pub(crate) fn settle(result: Result<Vec<u8>, ApiError>) -> Result<Settled, ApiError> {
    let settled = match result {
        Ok(body) => Settled::Succeeded(body),
        Err(err) if err.code.is_stored_outcome() => Settled::Refused(err.code.status(), err.body()),
        Err(err) => return Err(err),
    };
    let (Settled::Succeeded(body) | Settled::Refused(_, body)) = &settled;
    crate::engine::grow_to(body.len(), false)?;
    Ok(settled)
}

/// The answer for a key whose request still runs (here, or on a peer: another sqlhttpd process on the database): retry later,
/// and the first one's outcome replays.
pub(crate) fn in_use() -> ApiError {
    ApiError::new(
        ErrorCode::IdempotencyKeyInUse,
        "a request with this Idempotency-Key is still running; retry later",
    )
}

/// The key of the secret the server processes sharing a database prove themselves to each
/// other with (`transactions::peers`): each engine stores 256 random bits under it at start unless one
/// is there, so the first process to start draws it and every other reads that one back. A
/// space keeps it apart from every Idempotency-Key a client can send.
pub(crate) const PEER_SECRET_KEY: &str = "sqlhttp peer secret";

/// The peer secret's `created_at`: past every purge, so it never expires.
pub(crate) const NEVER_EXPIRES: i64 = i64::MAX;

/// The peer secret's identity (its `request_hash`).
pub(crate) fn peer_secret_hash() -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(PEER_SECRET_KEY).into()
}

/// Milliseconds since the epoch, the stored outcomes' clock.
pub(crate) fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `duration` in milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The creation time before which an outcome has expired under `ttl`.
pub(crate) fn expired_before(ttl: Duration) -> i64 {
    now_millis().saturating_sub(millis(ttl))
}

/// When expired keys were last purged: at most once a [`PURGE_INTERVAL`].
#[derive(Debug, Default)]
pub(crate) struct PurgeClock {
    last: Mutex<Option<Instant>>,
}

impl PurgeClock {
    /// Whether a purge is due now; if so, it counts as done from now.
    pub(crate) fn due(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < PURGE_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// A purge was just done (at start): the next is due a [`PURGE_INTERVAL`] from now.
    pub(crate) fn purged_now(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hash: &[u8], age: Duration) -> Stored {
        Stored {
            request_hash: hash.to_vec(),
            status: 409,
            body: b"{}".to_vec(),
            created_at: now_millis() - millis(age),
            position: None,
        }
    }

    #[test]
    fn a_live_outcome_of_the_same_request_replays_and_of_another_is_refused() {
        let ttl = Duration::from_secs(60);
        let replay = decide(Some(stored(b"a", Duration::ZERO)), b"a", ttl).unwrap();
        assert_eq!(
            replay,
            Decision::Replay(Outcome {
                status: 409,
                body: b"{}".to_vec(),
                replayed: true,
                position: None,
            })
        );
        let err = decide(Some(stored(b"a", Duration::ZERO)), b"b", ttl).unwrap_err();
        assert_eq!(err.code, ErrorCode::IdempotencyKeyReused);
    }

    #[test]
    fn nothing_or_an_expired_outcome_runs() {
        let ttl = Duration::from_secs(60);
        assert_eq!(
            decide(None, b"a", ttl).unwrap(),
            Decision::Run { expired: false }
        );
        let old = stored(b"b", Duration::from_secs(61));
        assert_eq!(
            decide(Some(old), b"a", ttl).unwrap(),
            Decision::Run { expired: true },
            "an expired key is free for any request"
        );
    }

    #[test]
    fn verdicts_are_stored_and_load_dependent_failures_are_not() {
        assert_eq!(
            settle(Ok(b"x".to_vec())).unwrap().into_parts(),
            (200, b"x".to_vec())
        );
        let (status, body) = settle(Err(ApiError::sql("no such table")))
            .unwrap()
            .into_parts();
        assert_eq!(status, 400);
        assert!(String::from_utf8(body).unwrap().contains("no such table"));
        let err = settle(Err(ApiError::unavailable("busy"))).unwrap_err();
        assert_eq!(err.code, ErrorCode::Unavailable);
    }

    #[test]
    fn the_purge_clock_ticks_once_an_interval() {
        let clock = PurgeClock::default();
        assert!(clock.due(), "the first purge is due at once");
        assert!(!clock.due());
        let started = PurgeClock::default();
        started.purged_now();
        assert!(!started.due());
    }
}
