//! Peers: the other sqlhttpd processes that serve one database, as the transaction layer knows
//! them (ADR 0036, "Replicas forward", as amended by issue 35 and by ADR 0058, which names them
//! peers: "replica" is left to PostgreSQL standbys). Which process holds a transaction is in
//! its token (`registry`); this file says where that process is reached, whether it lives, and
//! what the processes trust each other by.
//!
//! - **Where a process is reached** ([`advertise`], [`leave`]): a process with
//!   `--advertise-url` stores `{"url", "heartbeat"}` under `sqlhttp replica <instance>` (the
//!   key's word is kept as it was: peers of an earlier version read it) in the engine's
//!   idempotency store when its first transaction opens, then again every [`HEARTBEAT_EVERY`]
//!   from a task of its own, and at a graceful shutdown stores it with a heartbeat of 0. A
//!   record whose heartbeat is older than [`DEAD_AFTER`] names a dead process: nothing is
//!   forwarded to it, and the commit record answers. These records go through one named seam,
//!   [`PeerRecords`], over the engine contract's generic record calls (`store_record`,
//!   `recorded`): no engine knows their form.
//! - **The peer secret** ([`Secret`]): 256 random bits under `sqlhttp peer secret` (see
//!   `engine::keyed::PEER_SECRET_KEY`: each engine stores it at start unless it is there),
//!   read once by each process, never shown to a client. The store's keys hold a space: no
//!   client's Idempotency-Key can name them, and clients can reach the store through neither
//!   engine. A forwarded request's nonce is served once ([`Peers::first_use`]).
//! - **A silent process commits nothing** ([`Peers::fit_to_commit`]): its own heartbeat is
//!   what the others judge it by, so once its last stored heartbeat is [`STALE_AFTER`] old
//!   (the database did not take it: a lost connection, SQLite's write lock held) it rolls back
//!   every transaction it holds before it would run a COMMIT, and again before it says it is
//!   alive once more. The others answer "nothing committed" only past [`DEAD_AFTER`]; what is
//!   left is a COMMIT already running when the heartbeat fell silent that runs on past the gap
//!   between the two.
//! - **The client** a request for a peer's transaction is sent with ([`Peers::client`]): one
//!   connection pool, connecting within [`CONNECT_WITHIN`].
//!
//! How a forwarded request and its answer are signed and checked on the wire (headers, MACs,
//! the answer read within the server's budget) is `http::peers`'. Knows the engine contract's
//! record calls and the MAC; nothing about HTTP routes, tokens or either engine's SQL.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use axum::body::Body;
use hmac::{Hmac, KeyInit, Mac};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::sync::{OnceCell, watch};

use crate::engine::keyed::{PEER_SECRET_KEY, Stored, millis, now_millis, peer_secret_hash};
use crate::engine::{Backend, Engine as _};
use crate::protocol::error::ApiError;
use crate::transactions::Transactions;

/// How often a process with `--advertise-url` stores its record again.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// A record whose heartbeat is older than this names a dead process.
pub(crate) const DEAD_AFTER: Duration = Duration::from_secs(5);

/// A process whose own last stored heartbeat is older than this commits nothing more of what it
/// holds: it rolls its open transactions back (see [`Peers::fit_to_commit`]), well before the
/// others take it for dead at [`DEAD_AFTER`] and answer its transactions from their commit
/// records ("nothing committed"), so that answer never meets a COMMIT it runs afterwards.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(3);

/// How far a forwarded request's time may be from the receiver's clock.
pub(crate) const REPLAY_WINDOW: Duration = Duration::from_secs(5);

/// How long connecting to a holder may take: past it, it cannot be reached.
pub(crate) const CONNECT_WITHIN: Duration = Duration::from_secs(1);

/// The most nonces kept to refuse a replay (the oldest go first past it; a replay must also
/// fall within [`REPLAY_WINDOW`]).
const MAX_NONCES: usize = 1 << 16;

/// A MAC under the peer secret.
pub(crate) type HmacSha256 = Hmac<Sha256>;

/// The peer secret.
#[derive(Clone, Copy)]
pub(crate) struct Secret([u8; 32]);

impl Secret {
    /// The MAC of `fields` (each length-prefixed, after a tag naming what they are).
    pub(crate) fn mac(&self, tag: &str, fields: &[&[u8]]) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        for field in std::iter::once(&tag.as_bytes()).chain(fields) {
            let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
            mac.update(&len.to_be_bytes());
            mac.update(field);
        }
        mac
    }
}

impl Secret {
    /// A secret of `bytes` (for tests: a process reads its own from the store).
    #[cfg(test)]
    pub(crate) fn of(bytes: [u8; 32]) -> Secret {
        Secret(bytes)
    }
}

/// One process's record in the store.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    url: String,
    /// When it was last stored, in milliseconds since the epoch; 0 once the process left.
    heartbeat: i64,
}

/// The key under which process `instance` stores its record. ("replica" is what peers were
/// called when the key was named; it stays, so processes of either version find each other.)
fn record_key(instance: &str) -> String {
    format!("sqlhttp replica {instance}")
}

/// A record's identity (named as the key is, for the same reason).
fn record_hash() -> [u8; 32] {
    Sha256::digest(b"sqlhttp replica").into()
}

/// The named seam between peers and the engine's idempotency store: the peers' records and
/// the peer secret, stored and read through the engine contract's generic record calls.
#[derive(Debug, Clone)]
pub(crate) struct PeerRecords {
    engine: Arc<Backend>,
}

impl PeerRecords {
    /// Stores process `instance`'s record: reached at `url`, alive at `heartbeat`.
    async fn publish(&self, instance: &str, url: &str, heartbeat: i64) -> Result<(), ApiError> {
        let record = Record {
            url: url.to_owned(),
            heartbeat,
        };
        let body = serde_json::to_vec(&record).map_err(|_| ApiError::internal())?;
        self.engine
            .store_record(record_key(instance), record_hash(), body)
            .await
    }

    /// Process `instance`'s record, as stored.
    async fn lookup(&self, instance: &str) -> Result<Option<Stored>, ApiError> {
        self.engine.recorded(record_key(instance)).await
    }

    /// The peer secret each engine stored at its start.
    async fn secret(&self) -> Result<Secret, String> {
        match self.engine.recorded(PEER_SECRET_KEY.to_owned()).await {
            Ok(Some(stored))
                if stored.request_hash == peer_secret_hash() && stored.body.len() == 32 =>
            {
                let mut secret = [0; 32];
                secret.copy_from_slice(&stored.body);
                Ok(Secret(secret))
            }
            Ok(_) => Err("the store holds no peer secret".to_owned()),
            Err(err) => Err(err.message),
        }
    }
}

/// The running heartbeat task, and how to stop it.
struct Heartbeat {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Nonces of forwarded requests served within the replay window, oldest first.
#[derive(Default)]
struct Nonces {
    seen: HashSet<[u8; 16]>,
    order: VecDeque<(i64, [u8; 16])>,
}

impl Nonces {
    /// Whether `nonce` is new (then it is kept until `until`, in milliseconds).
    fn first(&mut self, nonce: [u8; 16], until: i64, now: i64) -> bool {
        while let Some(&(expiry, old)) = self.order.front() {
            if expiry >= now && self.order.len() < MAX_NONCES {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&old);
        }
        if !self.seen.insert(nonce) {
            return false;
        }
        self.order.push_back((until, nonce));
        true
    }
}

/// This process among its peers: its instance, where it is reached, the peer secret, its
/// heartbeat, and the nonces it has served.
pub(crate) struct Peers {
    instance: String,
    advertise: Option<String>,
    records: PeerRecords,
    secret: OnceCell<Secret>,
    beating: AtomicBool,
    /// When this process's record was last stored (its heartbeat's time, milliseconds since
    /// the epoch; 0 before the first).
    last_beat: AtomicI64,
    heartbeat: tokio::sync::Mutex<Option<Heartbeat>>,
    nonces: Mutex<Nonces>,
    client: Client<HttpConnector, Body>,
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peers")
            .field("instance", &self.instance)
            .field("advertise", &self.advertise)
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// The peers of process `instance`, reached at `advertise` when given, known through the
    /// records `engine` stores.
    pub(crate) fn new(instance: String, advertise: Option<String>, engine: Arc<Backend>) -> Peers {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_WITHIN));
        connector.set_nodelay(true);
        Peers {
            instance,
            advertise,
            records: PeerRecords { engine },
            secret: OnceCell::new(),
            beating: AtomicBool::new(false),
            last_beat: AtomicI64::new(0),
            heartbeat: tokio::sync::Mutex::new(None),
            nonces: Mutex::new(Nonces::default()),
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// The peer secret, read from the store once; `None` (logged) when it cannot be read.
    pub(crate) async fn secret(&self) -> Option<Secret> {
        let read = self.secret.get_or_try_init(|| self.records.secret()).await;
        match read {
            Ok(secret) => Some(*secret),
            Err(error) => {
                tracing::warn!(%error, "cannot read the peer secret");
                None
            }
        }
    }

    /// Where process `instance` is reached, when its heartbeat is fresh and it is not this one;
    /// `Err` when its record cannot be read (then whether it lives is not known).
    pub(crate) async fn reach(&self, instance: &str) -> Result<Option<String>, ()> {
        let Some(stored) = self.records.lookup(instance).await.map_err(drop)? else {
            return Ok(None);
        };
        Ok(self.fresh(instance, &stored))
    }

    /// Where process `instance` is reached, from its record `stored`, when its heartbeat is
    /// fresh and it is not this one.
    fn fresh(&self, instance: &str, stored: &Stored) -> Option<String> {
        if stored.request_hash != record_hash() {
            return None;
        }
        // A record of an earlier version (a bare URL, stored every ten minutes) does not parse:
        // such a process could not check a peer's MAC anyway.
        let record: Record = serde_json::from_slice(&stored.body).ok()?;
        if now_millis().saturating_sub(record.heartbeat) >= millis(DEAD_AFTER) {
            tracing::debug!(instance, "a peer's heartbeat stopped: not forwarded there");
            return None;
        }
        (self.advertise.as_deref() != Some(record.url.as_str())).then_some(record.url)
    }

    /// This process's instance.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// The client a request is sent to a peer with: one connection pool for all of them.
    pub(crate) fn client(&self) -> &Client<HttpConnector, Body> {
        &self.client
    }

    /// Whether this process may commit what it holds: it forwards nothing (no
    /// `--advertise-url`: no other process answers for its transactions), or its own last
    /// stored heartbeat is younger than [`STALE_AFTER`].
    pub(crate) fn fit_to_commit(&self) -> bool {
        if self.advertise.is_none() {
            return true;
        }
        let last = self.last_beat.load(Ordering::Acquire);
        last != 0 && now_millis().saturating_sub(last) < millis(STALE_AFTER)
    }

    /// Whether `nonce`, sent at `time`, was not served before.
    pub(crate) fn first_use(&self, nonce: [u8; 16], time: i64, now: i64) -> bool {
        self.nonces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first(nonce, time.saturating_add(millis(REPLAY_WINDOW)), now)
    }
}

/// Stores where the other processes reach this one, before its first transaction opens, and
/// starts the heartbeat that stores it again every [`HEARTBEAT_EVERY`] (until [`leave`]).
pub(crate) async fn advertise(peers: &Arc<Peers>, transactions: &Arc<Transactions>) {
    let Some(url) = &peers.advertise else { return };
    if peers.beating.load(Ordering::Acquire) {
        return;
    }
    let mut heartbeat = peers.heartbeat.lock().await;
    if heartbeat.is_some() {
        return;
    }
    let first = now_millis();
    if let Err(err) = peers.records.publish(&peers.instance, url, first).await {
        tracing::warn!(error = %err.message, "cannot record this process's --advertise-url");
        return;
    }
    peers.last_beat.store(first, Ordering::Release);
    let (stop, mut stopped) = watch::channel(false);
    let (owner, registry): (Weak<Peers>, Weak<Transactions>) =
        (Arc::downgrade(peers), Arc::downgrade(transactions));
    let task = tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                () = tokio::time::sleep(HEARTBEAT_EVERY) => {}
                _ = stopped.changed() => return,
            }
            let (Some(peers), Some(transactions)) = (owner.upgrade(), registry.upgrade()) else {
                return;
            };
            let url = peers.advertise.as_deref().unwrap_or_default();
            let beat = now_millis();
            match peers.records.publish(&peers.instance, url, beat).await {
                Ok(()) => {
                    failing = false;
                    // After a silence the others may have taken for death, nothing held
                    // across it commits: rolled back before this process says it is alive.
                    let last = peers.last_beat.load(Ordering::Acquire);
                    if beat.saturating_sub(last) >= millis(STALE_AFTER) {
                        tracing::warn!(
                            silent_ms = beat.saturating_sub(last),
                            "this process's heartbeat was silent: its open transactions are \
                             rolled back"
                        );
                        transactions.expire_all().await;
                    }
                    peers.last_beat.store(beat, Ordering::Release);
                }
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(
                        error = %err.message,
                        "cannot store this process's heartbeat: past {} s the other processes \
                         take it for dead",
                        DEAD_AFTER.as_secs()
                    );
                }
                Err(_) => {}
            }
        }
    });
    *heartbeat = Some(Heartbeat { stop, task });
    peers.beating.store(true, Ordering::Release);
}

/// Stops the heartbeat and marks this process's record gone (a graceful shutdown, once its
/// transactions have ended): the other processes answer from the commit records at once.
pub(crate) async fn leave(peers: &Peers) {
    let Some(url) = &peers.advertise else { return };
    let Some(Heartbeat { stop, task }) = peers.heartbeat.lock().await.take() else {
        return;
    };
    let _ = stop.send(true);
    // Its store in flight lands first: none comes after the one below.
    let _ = task.await;
    if let Err(err) = peers.records.publish(&peers.instance, url, 0).await {
        tracing::debug!(error = %err.message, "cannot mark this process's record gone");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_served_once_within_its_window() {
        let mut nonces = Nonces::default();
        assert!(nonces.first([1; 16], 5_000, 0));
        assert!(!nonces.first([1; 16], 5_000, 10));
        assert!(nonces.first([2; 16], 5_000, 10));
        // Past its window it is forgotten (the time check refuses it by then).
        assert!(nonces.first([1; 16], 20_000, 6_000));
        assert_eq!(nonces.order.len(), 1);
    }
}
