//! The registry of interactive transactions ([`Transactions`]): the engine it asks for
//! sessions, which open transaction a token names and whose it is ([`Entry`], its state one
//! request at a time in [`Live`]), the finished ones' outcomes, the counts for `/metrics`, and
//! the bounds kept by a reaper task (idle timeout, lifetime cap, the engine ending one on its
//! own).
//!
//! Knows the engine contract and the protocol's errors; nothing about HTTP or either engine's
//! SQL. Opening is `open`'s, what runs in a transaction `running`'s, how one ended `ending`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::budget::Budget;
use crate::config::TransactionLimits;
use crate::engine::interactive::Interactive as _;
use crate::engine::{Backend, Session};
use crate::transactions::ending::{Ending, Endings};
use crate::transactions::entry::{Entry, Live, OpenSlot, lock};
use crate::transactions::owners::Owners;

/// Counts for the metrics.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) commits: AtomicU64,
    pub(super) rollbacks: AtomicU64,
    pub(super) expirations: AtomicU64,
    pub(super) aborts: AtomicU64,
}

/// Transaction counts for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TransactionCounts {
    /// Open now.
    pub(crate) open: usize,
    /// Committed since the start.
    pub(crate) commits: u64,
    /// Rolled back by their clients (or by a failed COMMIT) since the start.
    pub(crate) rollbacks: u64,
    /// Rolled back by the server (idle, too old, shutdown) since the start.
    pub(crate) expirations: u64,
    /// Aborted (serialization failure, deadlock, lost connection) since the start.
    pub(crate) aborts: u64,
}

/// The registry of interactive transactions.
pub(crate) struct Transactions {
    /// The engine, asked for sessions and for commit records through the [`Engine`] calls.
    ///
    /// [`Engine`]: crate::engine::Engine
    pub(super) engine: Arc<Backend>,
    pub(super) limits: TransactionLimits,
    pub(super) ttl: Option<Duration>,
    pub(super) max_result_bytes: usize,
    pub(super) budget: Budget,
    /// The part of `budget` transactions' stored results may hold together (half of it), so
    /// transactions that are open, whatever they run, always leave the rest to plain
    /// requests, keyed ones and batches.
    pub(super) share: Budget,
    /// Each owner's share of the open transactions and of `share`.
    pub(super) owners: Owners,
    pub(super) instance: String,
    pub(super) slots: Arc<Semaphore>,
    pub(super) live: Mutex<HashMap<String, Arc<Entry>>>,
    /// Each `(owner, Idempotency-Key)` an open came with, and the token it opened: a re-sent
    /// open waits here for the first one and answers its transaction.
    pub(super) opens: Mutex<HashMap<(String, String), OpenSlot>>,
    /// How finished transactions ended, and the commit records of those forgotten.
    pub(super) endings: Endings,
    pub(super) counters: Counters,
    pub(super) reaper: AtomicBool,
    /// The server is shutting down: no transaction opens any more.
    pub(super) closed: AtomicBool,
}

impl std::fmt::Debug for Transactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactions")
            .field("limits", &self.limits)
            .field("open", &lock(&self.live).len())
            .finish_non_exhaustive()
    }
}

impl Transactions {
    /// An empty registry under `limits`; finished outcomes and commit records are kept for
    /// `ttl` (the idempotency TTL; without one, commits are not recorded in the database).
    pub(crate) fn new(
        engine: Arc<Backend>,
        limits: TransactionLimits,
        ttl: Option<Duration>,
        max_result_bytes: usize,
        budget: Budget,
    ) -> Transactions {
        let instance = format!("{:08x}", rand::random::<u32>());
        let endings = Endings::new(Arc::clone(&engine), ttl, instance.clone());
        Transactions {
            engine,
            limits,
            ttl,
            max_result_bytes,
            share: Budget::new(budget.bytes() / 2),
            owners: Owners::new(limits.max_open, budget.bytes() / 2, max_result_bytes),
            budget,
            instance,
            slots: Arc::new(Semaphore::new(limits.max_open)),
            live: Mutex::new(HashMap::new()),
            opens: Mutex::new(HashMap::new()),
            endings,
            counters: Counters::default(),
            reaper: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// This process's instance: the first part of its tokens.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// The instance that holds `token`, when that is another process: this one neither holds
    /// it nor knows how it ended (the request may be forwarded there: `transactions::peers`).
    pub(crate) fn held_elsewhere<'t>(&self, token: &'t str) -> Option<&'t str> {
        let instance = token.split('.').next()?;
        let elsewhere = instance != self.instance
            && !lock(&self.live).contains_key(token)
            && !self.endings.knows(token);
        elsewhere.then_some(instance)
    }

    /// The counts for the metrics.
    pub(crate) fn counts(&self) -> TransactionCounts {
        TransactionCounts {
            open: lock(&self.live).len(),
            commits: self.counters.commits.load(Ordering::Relaxed),
            rollbacks: self.counters.rollbacks.load(Ordering::Relaxed),
            expirations: self.counters.expirations.load(Ordering::Relaxed),
            aborts: self.counters.aborts.load(Ordering::Relaxed),
        }
    }

    /// Rolls back every open transaction and opens no more (the server is shutting down).
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.expire_all().await;
    }

    /// Rolls back every open transaction (each running statement or COMMIT finishes first):
    /// later requests for them are `410 TRANSACTION_EXPIRED`.
    pub(crate) async fn expire_all(&self) {
        let entries: Vec<Arc<Entry>> = lock(&self.live).values().cloned().collect();
        for entry in entries {
            let mut live = entry.state.lock().await;
            if let Some(session) = live.session.take() {
                live.last = None;
                session.rollback().await;
                self.finish(&entry, Ending::Expired);
            }
        }
    }

    /// The open transaction `token` if `owner` holds it.
    pub(super) fn find(&self, owner: &str, token: &str) -> Option<Arc<Entry>> {
        lock(&self.live)
            .get(token)
            .filter(|entry| entry.owner == owner)
            .cloned()
    }

    /// Rolls the transaction back if it was idle or open too long; `true` if it did.
    pub(super) fn expire_if_due(self: &Arc<Self>, entry: &Arc<Entry>, live: &mut Live) -> bool {
        if live.session.is_none() {
            return false;
        }
        let now = Instant::now();
        let idle = now.saturating_duration_since(live.last_used) >= self.limits.idle_timeout;
        let old = now.saturating_duration_since(entry.opened_at) >= self.limits.max_lifetime;
        // The engine ended it on its own (ADR 0042): expired, as the registry's bounds do.
        let ended = live.session.as_ref().is_some_and(Session::must_end);
        if !(idle || old || ended) {
            return false;
        }
        if let Some(session) = live.session.take() {
            live.last = None;
            tokio::spawn(session.rollback());
        }
        tracing::debug!(
            idle,
            old,
            ended,
            "an interactive transaction expired; rolled back"
        );
        self.finish(entry, Ending::Expired);
        true
    }

    /// Moves `entry` from the open transactions to the finished ones.
    pub(super) fn finish(&self, entry: &Entry, ending: Ending) {
        let counter = match &ending {
            Ending::Committed(..) => &self.counters.commits,
            Ending::Refused(_) | Ending::RolledBack => &self.counters.rollbacks,
            Ending::Expired => &self.counters.expirations,
            Ending::Aborted(_) | Ending::Unknown(_) => &self.counters.aborts,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            ending = ending.name().as_str(),
            "an interactive transaction ended"
        );
        lock(&self.live).remove(&entry.token);
        if let Some(key) = &entry.open_key {
            lock(&self.opens).remove(&(entry.owner.clone(), key.clone()));
        }
        self.endings.remember(&entry.token, &entry.owner, ending);
    }

    /// Starts the task that expires idle and old transactions, once (from the first open:
    /// the registry may be built outside a runtime).
    pub(super) fn start_reaper(self: &Arc<Self>) {
        if self.reaper.swap(true, Ordering::AcqRel) {
            return;
        }
        let every = (self.limits.idle_timeout.min(self.limits.max_lifetime) / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let registry: Weak<Transactions> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                registry.endings.expire(Instant::now());
                let entries: Vec<Arc<Entry>> = lock(&registry.live).values().cloned().collect();
                for entry in entries {
                    // A transaction running a statement now is not idle.
                    if let Ok(mut live) = Arc::clone(&entry.state).try_lock_owned() {
                        registry.expire_if_due(&entry, &mut live);
                    }
                }
            }
        });
    }
}
