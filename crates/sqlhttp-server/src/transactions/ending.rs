//! How interactive transactions end, and how a request for one that has ended is answered:
//! [`Ending`] (committed, refused at its COMMIT, rolled back, expired, aborted, or its COMMIT's
//! outcome unknown), kept per token for the idempotency TTL; [`answer`] for each request
//! ([`Op`]) against each ending; and, for a token this process does not remember (another
//! process's, or one from before a restart), the commit record in the engine's idempotency
//! store, read through the [`Engine`](crate::engine::Engine) calls (`recorded`, `claim_record`): committed if it is
//! there, else "nothing committed", made final by a tombstone before it is said.
//!
//! Knows the engine contract's record calls and the protocol's errors and bodies; nothing about
//! HTTP, peers or either engine's SQL.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use crate::engine::keyed::millis;
use crate::engine::{Backend, Engine as _, Outcome};
use crate::protocol::bookmark::{Position, ServedBy};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::transaction::{self as body, Outcome as TxOutcome};
use crate::transactions::entry::lock;
use crate::transactions::finished::Finished;

/// How long finished outcomes are kept in memory when the server keeps no idempotency keys.
pub(super) const KEPT_WITHOUT_TTL: Duration = Duration::from_secs(300);

/// The most finished outcomes kept in memory, all owners together: past it, the oldest of the
/// owner that holds the most goes first (see `transactions::finished`).
pub(super) const MAX_FINISHED: usize = 65_536;

/// How long after a COMMIT's answer from the database was lost its outcome stays "unknown"
/// when no commit record is found: the session that ran it is cancelled and terminated when
/// the answer is lost (within the engine's connect limit, 5 s), and until it is gone the COMMIT
/// may still land, record and all. Past this, no record means it did not commit.
pub(super) const UNKNOWN_SETTLES: Duration = Duration::from_secs(10);

/// The longest error message a finished outcome keeps (a trigger's `RAISE` may carry
/// megabytes): the rest is cut, so what the registry holds of finished transactions is bounded
/// by bytes as well as by count. A finished outcome costs about 1 KiB with this (measured: the
/// registry's memory levels off near 70 MiB once [`MAX_FINISHED`] are kept).
pub(super) const MAX_KEPT_MESSAGE: usize = 512;

/// How a transaction ended, as later requests for it are answered.
#[derive(Debug, Clone)]
pub(super) enum Ending {
    /// Committed: the COMMIT's answer body (small: the server writes it), and where the
    /// commit stands in the log (the COMMIT's own bookmark, or a position read after its
    /// record was found), so every answer that reports it carries a bookmark at or past it.
    Committed(Bytes, Option<Position>),
    /// Its COMMIT failed and it was rolled back: the COMMIT's error.
    Refused(ApiError),
    /// Its client rolled it back.
    RolledBack,
    /// The server rolled it back (idle, too old, shut down).
    Expired,
    /// It could not go on (serialization failure, deadlock, lost connection).
    Aborted(ApiError),
    /// Its COMMIT's answer from the database was lost (at this instant): the commit record
    /// tells, once the COMMIT cannot be in flight any more (see [`UNKNOWN_SETTLES`]).
    Unknown(Instant),
}

impl Ending {
    pub(super) fn name(&self) -> TxOutcome {
        match self {
            Ending::Committed(..) => TxOutcome::Committed,
            Ending::Refused(_) | Ending::RolledBack => TxOutcome::RolledBack,
            Ending::Expired => TxOutcome::Expired,
            Ending::Aborted(_) => TxOutcome::Aborted,
            Ending::Unknown(_) => TxOutcome::Unknown,
        }
    }
}

/// What a request asks of a transaction that has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Step,
    Commit,
    Rollback,
    Outcome,
}

/// `err` with its message cut to [`MAX_KEPT_MESSAGE`] bytes, for a finished outcome.
pub(super) fn bounded(mut err: ApiError) -> ApiError {
    if err.message.len() > MAX_KEPT_MESSAGE {
        let mut end = MAX_KEPT_MESSAGE;
        while !err.message.is_char_boundary(end) {
            end -= 1;
        }
        err.message.truncate(end);
        err.message.push_str(" ... (cut)");
    }
    err
}

/// The answer for a transaction the server rolled back.
pub(crate) fn expired() -> ApiError {
    ApiError::new(
        ErrorCode::TransactionExpired,
        "the transaction expired and was rolled back by the server (it was idle too long, open \
         too long, or its server restarted or is another one); nothing of it was committed",
    )
}

pub(super) fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such transaction")
}

pub(super) fn finished(how: &str) -> ApiError {
    ApiError::new(
        ErrorCode::TransactionFinished,
        format!("the transaction has ended ({how}); nothing more runs in it"),
    )
}

/// The commit record's key in the idempotency store: a space keeps it apart from every
/// Idempotency-Key a client can send (visible ASCII only).
pub(super) fn record_key(token: &str) -> String {
    format!("sqlhttp transaction {token}")
}

/// A tombstone's identity: "nothing of `token` committed", said by a server that answered for
/// it (no owner's record hash is this).
pub(super) fn tombstone_hash(token: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(b"sqlhttp transaction tombstone\n")
        .chain_update(token)
        .finalize()
        .into()
}

/// The commit record's identity: the owner's, so another credential's lookup finds nothing.
pub(super) fn record_hash(owner: &str, token: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(b"sqlhttp transaction\n")
        .chain_update(owner)
        .chain_update(b"\n")
        .chain_update(token)
        .finalize()
        .into()
}

/// How finished transactions ended (a fair share per owner, see `transactions::finished`), and
/// the commit records of those this process does not remember, read through the engine.
pub(super) struct Endings {
    engine: Arc<Backend>,
    ttl: Option<Duration>,
    /// This process's instance: the first part of its tokens.
    instance: String,
    finished: Mutex<Finished<Ending>>,
}

impl Endings {
    /// None yet; kept for `ttl` (the idempotency TTL; without one, [`KEPT_WITHOUT_TTL`]).
    pub(super) fn new(engine: Arc<Backend>, ttl: Option<Duration>, instance: String) -> Endings {
        Endings {
            engine,
            ttl,
            instance,
            finished: Mutex::new(Finished::new(MAX_FINISHED, ttl.unwrap_or(KEPT_WITHOUT_TTL))),
        }
    }

    /// Whether how `token` ended is kept here.
    pub(super) fn knows(&self, token: &str) -> bool {
        lock(&self.finished).contains(token)
    }

    /// Drops what is past its time.
    pub(super) fn expire(&self, now: Instant) {
        lock(&self.finished).expire(now);
    }

    /// Answers a request for a transaction that is not open here: from the finished outcomes,
    /// or, for another server's (or an earlier run's) token, from its commit record.
    pub(super) async fn ended(
        &self,
        owner: &str,
        token: &str,
        op: Op,
    ) -> Result<Outcome, ApiError> {
        let known = {
            let finished = lock(&self.finished);
            finished
                .get(token)
                .map(|(whose, ending)| (whose == owner).then(|| ending.clone()))
        };
        let ending = match known {
            Some(None) => return Err(not_found()),
            Some(Some(Ending::Unknown(since))) => {
                // Once the COMMIT cannot be in flight any more, "not committed" is made final.
                let settled = since.elapsed() >= UNKNOWN_SETTLES;
                match self.read_record(owner, token, settled).await? {
                    committed @ Ending::Committed(..) => committed,
                    // The COMMIT whose answer was lost may still be finishing on the database
                    // (its session is being ended): no record yet is not "never committed".
                    _ if since.elapsed() < UNKNOWN_SETTLES => Ending::Unknown(since),
                    not_committed => not_committed,
                }
            }
            Some(Some(ending)) => ending,
            // One of this server's own that it no longer remembers (past the cap of finished
            // outcomes): committed if its record says so, else never one it issued.
            None if token.split('.').next() == Some(self.instance.as_str()) => {
                match self.read_record(owner, token, false).await? {
                    committed @ Ending::Committed(..) => committed,
                    _ => return Err(not_found()),
                }
            }
            // Another process's (or one from before a restart): "nothing committed" is made
            // final before it is said, so its holder, if alive, can never commit it after.
            None => self.read_record(owner, token, true).await?,
        };
        answer(op, &ending)
    }

    /// The commit record of `token`: committed, or (nothing recorded) expired. With `fence`,
    /// "expired" is made final first: a tombstone claims the record's key (unless the record
    /// is there), so a COMMIT its holder still runs finds it and rolls back (see
    /// `engine::interactive::fenced`); whichever claims the key first is the answer.
    pub(super) async fn read_record(
        &self,
        owner: &str,
        token: &str,
        fence: bool,
    ) -> Result<Ending, ApiError> {
        let Some(ttl) = self.ttl else {
            // Without the store, commits are not recorded: "nothing committed" would be a guess.
            return Err(ApiError::unavailable(
                "this server keeps no commit records (--no-idempotency), and it does not know how \
                 this transaction ended (another server's, or one from before a restart): whether \
                 it committed cannot be told here",
            ));
        };
        let mut stored = self.engine.recorded(record_key(token)).await?;
        if fence && stored.is_none() {
            stored = Some(
                self.engine
                    .claim_record(
                        record_key(token),
                        tombstone_hash(token),
                        410,
                        body::outcome(TxOutcome::Expired),
                    )
                    .await?,
            );
        }
        let fresh = |created_at: i64| {
            crate::engine::keyed::now_millis().saturating_sub(created_at) < millis(ttl)
        };
        Ok(match stored {
            Some(stored)
                if stored.request_hash == record_hash(owner, token) && fresh(stored.created_at) =>
            {
                // Read with the record: at or past the commit that made it visible.
                let position = stored.position.map(|bookmark| Position {
                    bookmark,
                    served_by: ServedBy::Primary,
                });
                let ending = Ending::Committed(Bytes::from(stored.body), position);
                self.remember(token, owner, ending.clone());
                ending
            }
            _ => Ending::Expired,
        })
    }

    /// How `token` ended, when that is kept here.
    pub(super) fn ending_of(&self, token: &str) -> Option<Ending> {
        lock(&self.finished)
            .get(token)
            .map(|(_, ending)| ending.clone())
    }

    /// Keeps how `token` ended, for the TTL, dropping what is older (or past the cap); an
    /// error is kept with its message cut to [`MAX_KEPT_MESSAGE`].
    pub(super) fn remember(&self, token: &str, owner: &str, ending: Ending) {
        let ending = match ending {
            Ending::Refused(err) => Ending::Refused(bounded(err)),
            Ending::Aborted(err) => Ending::Aborted(bounded(err)),
            other => other,
        };
        lock(&self.finished).keep(token, owner, ending, Instant::now());
    }
}

/// How a request `op` for a transaction that ended as `ending` is answered.
pub(super) fn answer(op: Op, ending: &Ending) -> Result<Outcome, ApiError> {
    let replayed = |body: Vec<u8>, position: Option<Position>| {
        Ok(Outcome {
            status: 200,
            body,
            replayed: true,
            position,
        })
    };
    match (op, ending) {
        (Op::Outcome, Ending::Committed(_, position)) => {
            Ok(Outcome::fresh(body::outcome(ending.name())).at(*position))
        }
        (Op::Outcome, ending) => Ok(Outcome::fresh(body::outcome(ending.name()))),
        // The committed answer is the server's own `{"outcome":"committed"}`: a few bytes.
        (Op::Commit, Ending::Committed(body, position)) => replayed(body.to_vec(), *position),
        (Op::Step, Ending::Committed(..)) => Err(finished(TxOutcome::Committed.as_str())),
        (Op::Rollback, Ending::Committed(..)) => {
            Err(finished("committed: it cannot be rolled back"))
        }
        (Op::Commit, Ending::Refused(err)) | (Op::Commit | Op::Step, Ending::Aborted(err)) => {
            Err(err.clone())
        }
        (Op::Step, Ending::Refused(_)) => Err(finished("rolled back at its COMMIT")),
        (Op::Commit | Op::Step, Ending::RolledBack) => Err(finished(
            "rolled back by its client; nothing of it was committed",
        )),
        (Op::Commit | Op::Step, Ending::Expired) => Err(expired()),
        (Op::Commit | Op::Step, Ending::Unknown(_)) => Err(ApiError::outcome_unknown(
            "whether the transaction committed is not known yet; send the COMMIT again (or ask \
             for its outcome) until it is",
        )),
        (Op::Rollback, ending) => replayed(body::outcome(ending.name()), None),
    }
}
