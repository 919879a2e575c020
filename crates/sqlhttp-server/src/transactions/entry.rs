//! What the registry keeps of one open interactive transaction ([`Entry`], its state one request
//! at a time in [`Live`], its last statement's answer in [`Kept`]), and the registry's answer to
//! a request ([`Answer`]): the pieces the registry, opening and running share.
//!
//! Knows the engine's session and the server's budget; nothing about HTTP, tokens' meaning or
//! how a transaction ended (`ending`).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use crate::budget::Held;
use crate::engine::interactive::TxOptions;
use crate::engine::{Outcome, Session};
use crate::protocol::bookmark::Position;
use crate::transactions::owners::OwnerSlot;

/// The transaction's state, one request at a time.
pub(super) struct Live {
    /// `None` once it ended.
    pub(super) session: Option<Session>,
    /// The sequence number of the last statement run (0 before the first).
    pub(super) seq: u64,
    /// The last statement's answer, for its re-send.
    pub(super) last: Option<Kept>,
    pub(super) last_used: Instant,
}

/// One open transaction.
pub(super) struct Entry {
    pub(super) token: String,
    pub(super) owner: String,
    pub(super) options: TxOptions,
    pub(super) opened_at: Instant,
    /// The Idempotency-Key it was opened under, if any.
    pub(super) open_key: Option<String>,
    /// Its open's answer, for a re-sent open, with the snapshot's position when it has one.
    pub(super) opened: Vec<u8>,
    pub(super) opened_at_position: Option<Position>,
    pub(super) state: Arc<tokio::sync::Mutex<Live>>,
    /// Its place among its owner's open transactions.
    pub(super) owner_share: OwnerSlot,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// The token an open under one key opened, `None` while it runs (or after it failed).
pub(super) type OpenSlot = Arc<tokio::sync::Mutex<Option<String>>>;

/// The last statement's answer, kept for its re-send: the statement it answered (a digest of
/// its text and parameters: a re-send under the same number must be the same statement), and
/// its shares of the server's budget, of the part of it transactions may hold, and of its
/// owner's part of that: held by the kept answer and by every answer that sends it, until the
/// last of them is done.
pub(super) struct Kept {
    pub(super) status: u16,
    pub(super) body: Bytes,
    pub(super) statement: [u8; 32],
    pub(super) held: Arc<Held>,
}

impl Kept {
    /// An answer that sends the kept body (shared, not copied), holding its shares.
    pub(super) fn answer(&self, replayed: bool) -> Answer {
        Answer {
            status: self.status,
            body: self.body.clone(),
            replayed,
            position: None,
            held: Held::sharing(&self.held),
        }
    }
}

/// A request's answer from the registry: a status and JSON body, with the shares of the
/// server's budget the body holds until it has been sent (a stored result's, shared by each
/// of its answers; nothing for the small answers the registry writes itself).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Bytes,
    pub(crate) replayed: bool,
    /// Where the answer stands (`Sqlhttp-Bookmark`), when it is known.
    pub(crate) position: Option<Position>,
    pub(crate) held: Held,
}

impl From<Outcome> for Answer {
    fn from(outcome: Outcome) -> Answer {
        Answer {
            status: outcome.status,
            body: Bytes::from(outcome.body),
            replayed: outcome.replayed,
            position: outcome.position,
            held: Held::default(),
        }
    }
}

/// A mutex's guard, a poisoned one taken as it is (nothing it guards is left half-done).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
