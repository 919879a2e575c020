//! Read replicas (ADR 0039): [`Replicas`], the streaming replicas of the primary that serve
//! verified reads, each a pool of its own (an [`Inner`] whose [`Node`] is a replica), with
//! [`Watch`], what a watcher task keeps learning of each (whether it answers and replays, how
//! far it has replayed, how far behind the primary it is), and [`Replicas::choose`], which picks
//! the node for one read: a fit replica that has replayed as far as the read's bookmark asks
//! (waiting at most `--replica-wait` for one), else the primary.
//!
//! Knows the replicas' pools and how to ask PostgreSQL for log positions; nothing about what a
//! read runs or about HTTP. The engine (`mod.rs`) runs the read where this chose and serves it
//! from the primary when a replica fails it.
//!
//! Past 600 lines on purpose for now: `engine/postgres/` is rebuilt on `sqlhttp-pgwire` by issue 38
//! (ADR 0059), which splits it by concern; issue 39 left this folder as it is.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_postgres::Client;

use crate::engine::postgres::ahead::PrimaryLog;
use crate::engine::postgres::{Inner, wire};
use crate::engine::{ReplicaReport, ReplicaState};
use crate::protocol::bookmark::{Bookmark, ReadAt, ServedBy};

/// How often a replica is asked how it is, when no read waits for it.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// How often it is asked while a read waits for it to replay further.
const WATCH_WAITED_EVERY: Duration = Duration::from_millis(2);

/// How long one question to a replica (or the primary) may take before the replica counts as
/// not answering.
const PROBE_WITHIN: Duration = Duration::from_secs(1);

/// The least time between two samples of the primary's position kept for the lag.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Which database a pool serves.
#[derive(Debug)]
pub(super) enum Node {
    /// The `--database`: every write, and reads no replica serves.
    Primary,
    /// A `--read-replica`, with what its watcher learns.
    Replica(Arc<Watch>),
}

impl Node {
    pub(super) fn is_replica(&self) -> bool {
        matches!(self, Node::Replica(_))
    }

    /// What a read's `BEGIN` message selects, once its snapshot is taken, as its position: on
    /// the primary, the end of its log (everything committed before the snapshot is before it);
    /// on a replica, how far it has received the log, or replayed it when that is further.
    ///
    /// Not how far it has replayed alone: a replica shows a commit to new snapshots while it
    /// still applies the commit's record, before its replay position moves past that record
    /// (a commit that drops files, or carries many invalidations, is applied for a while). A
    /// snapshot taken then sees the commit, and a replay position read after it can still be
    /// short of it: another replica that replayed only that far would pass for consistent with
    /// the read without the commit. A record being applied has been received whole, so the
    /// received position is past it.
    pub(super) fn position_sql(&self) -> &'static str {
        match self {
            Node::Primary => "pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text",
            Node::Replica(_) => {
                "GREATEST(pg_catalog.pg_last_wal_replay_lsn(), \
                 pg_catalog.pg_last_wal_receive_lsn())::pg_catalog.text"
            }
        }
    }

    /// Whether this is a replica its watcher finds gone (it does not answer or replay).
    pub(super) fn is_gone(&self) -> bool {
        match self {
            Node::Primary => false,
            Node::Replica(watch) => !watch.healthy.load(Ordering::Acquire),
        }
    }

    /// Resolves when the replica's watcher finds it gone (never on the primary), or at once
    /// when it is found gone already: its reads are abandoned and served elsewhere. A read
    /// that chose the replica just before its watcher found it gone missed the watcher's wake
    /// and would otherwise wait for a replica that does not answer.
    pub(super) async fn gone(&self) {
        match self {
            Node::Primary => std::future::pending().await,
            Node::Replica(watch) => {
                let notified = watch.gone.notified();
                let mut notified = std::pin::pin!(notified);
                // Registered before the flag is read: a watcher that clears it after wakes this.
                notified.as_mut().enable();
                if watch.healthy.load(Ordering::Acquire) {
                    notified.await;
                }
            }
        }
    }
}

/// What a replica's watcher knows of it.
#[derive(Debug, Default)]
pub(super) struct Watch {
    healthy: AtomicBool,
    /// How far it has replayed, when last asked.
    replayed: AtomicU64,
    /// How far behind the primary it was, in milliseconds.
    lag_ms: AtomicU64,
    /// Woken when the watcher finds the replica gone.
    gone: Notify,
}

impl Watch {
    fn fit(&self, max_lag: Duration) -> bool {
        self.healthy.load(Ordering::Acquire)
            && Duration::from_millis(self.lag_ms.load(Ordering::Acquire)) <= max_lag
    }

    fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Acquire)
    }
}

/// One read replica: its pool and what is known of it.
pub(super) struct Replica {
    pub(super) inner: Arc<Inner>,
    watch: Arc<Watch>,
    /// How the watcher logs in (the replica's URL, its own role).
    monitor: wire::Target,
}

impl Replica {
    pub(super) fn new(inner: Arc<Inner>, watch: Arc<Watch>, monitor: wire::Target) -> Replica {
        Replica {
            inner,
            watch,
            monitor,
        }
    }

    /// How its watcher logs in.
    pub(super) fn monitor(&self) -> &wire::Target {
        &self.monitor
    }
}

/// Where [`Replicas::choose`] sends a read, and why.
pub(super) enum Choice<'a> {
    Replica(&'a Replica),
    Primary(Reason),
}

/// Where a read runs (see `PostgresEngine::read`): the primary, which has everything committed,
/// or a replica, whose session must have replayed as far as `min` before the read's snapshot.
#[derive(Clone)]
pub(super) enum Route {
    Primary(Arc<Inner>),
    Replica { node: Arc<Inner>, min: u64 },
}

impl Route {
    /// The pool the read runs on.
    pub(super) fn node(&self) -> &Arc<Inner> {
        match self {
            Route::Primary(node) | Route::Replica { node, .. } => node,
        }
    }

    /// Who serves the read, as its answer says.
    pub(super) fn served_by(&self) -> ServedBy {
        match self {
            Route::Primary(_) => ServedBy::Primary,
            Route::Replica { .. } => ServedBy::Replica,
        }
    }

    /// The least position the read must see (0 on the primary).
    pub(super) fn min(&self) -> u64 {
        match self {
            Route::Primary(_) => 0,
            Route::Replica { min, .. } => *min,
        }
    }
}

/// Why a read was served where it was (the metrics' `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    /// A replica was fit and far enough.
    Routed,
    /// `Sqlhttp-Consistency: primary`.
    Asked,
    /// No replica was healthy and close enough.
    NoReplica,
    /// None had replayed as far as the bookmark within `--replica-wait`.
    Behind,
    /// The replica failed it before its answer started.
    Failed,
}

impl Reason {
    const ALL: [Reason; 5] = [
        Reason::Routed,
        Reason::Asked,
        Reason::NoReplica,
        Reason::Behind,
        Reason::Failed,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Reason::Routed => "routed",
            Reason::Asked => "asked",
            Reason::NoReplica => "no_replica",
            Reason::Behind => "behind",
            Reason::Failed => "failed",
        }
    }
}

/// The read replicas, their watchers and the reads they served.
pub(super) struct Replicas {
    nodes: Vec<Replica>,
    /// How the watchers ask the primary for its position (the `--database` URL's role).
    primary: wire::Target,
    /// Where the watchers' samples of the primary's position go (see `ahead`).
    log: Arc<PrimaryLog>,
    max_lag: Duration,
    wait: Duration,
    next: AtomicUsize,
    /// Reads waiting for a replica to replay further: the watchers then ask more often.
    waiting: Arc<AtomicUsize>,
    /// Wakes the watchers when a read starts waiting.
    wake: Arc<Notify>,
    /// Woken by the watchers each time they learned something: waiting reads look again.
    learned: Arc<Notify>,
    watching: AtomicBool,
    /// Reads served, by who served them and why: `[replica, primary]` × [`Reason::ALL`].
    served: [[AtomicU64; 5]; 2],
}

impl Replicas {
    pub(super) fn new(
        nodes: Vec<Replica>,
        primary: wire::Target,
        log: Arc<PrimaryLog>,
        max_lag: Duration,
        wait: Duration,
    ) -> Replicas {
        Replicas {
            nodes,
            primary,
            log,
            max_lag,
            wait,
            next: AtomicUsize::new(0),
            waiting: Arc::default(),
            wake: Arc::default(),
            learned: Arc::default(),
            watching: AtomicBool::new(false),
            served: Default::default(),
        }
    }

    /// Starts the watchers, once, on the current runtime (when there is one).
    pub(super) fn watch(&self) {
        if tokio::runtime::Handle::try_current().is_err()
            || self.watching.swap(true, Ordering::AcqRel)
        {
            return;
        }
        for (index, replica) in self.nodes.iter().enumerate() {
            let watcher = Watcher {
                index,
                replica: Arc::downgrade(&replica.inner),
                watch: Arc::clone(&replica.watch),
                monitor: wire::Target {
                    config: replica.monitor.config.clone(),
                    tls: Arc::clone(&replica.monitor.tls),
                },
                primary: wire::Target {
                    config: self.primary.config.clone(),
                    tls: Arc::clone(&self.primary.tls),
                },
                log: Arc::clone(&self.log),
                waiting: Arc::clone(&self.waiting),
                wake: Arc::clone(&self.wake),
                learned: Arc::clone(&self.learned),
                samples: Mutex::new(VecDeque::new()),
                keep: samples_for(self.max_lag),
            };
            tokio::spawn(watcher.run());
        }
    }

    /// Where a read consistent with at least `at` runs: a fit replica (round robin) that has
    /// replayed that far, waiting at most `--replica-wait` for one, else the primary.
    pub(super) async fn choose(&self, at: ReadAt) -> Choice<'_> {
        if at.primary {
            return Choice::Primary(Reason::Asked);
        }
        self.watch();
        let min = at.min.map_or(0, |bookmark| bookmark.position());
        if let Some(replica) = self.far_enough(min) {
            return Choice::Replica(replica);
        }
        if !self.nodes.iter().any(|r| r.watch.fit(self.max_lag)) {
            return Choice::Primary(Reason::NoReplica);
        }
        if self.wait.is_zero() {
            return Choice::Primary(Reason::Behind);
        }
        // A waiting read costs a wake-up each time a watcher learned something (every
        // `WATCH_WAITED_EVERY` per replica while reads wait), however many reads wait.
        let _waiting = Waiting::start(&self.waiting, &self.wake);
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let learned = self.learned.notified();
            let mut learned = std::pin::pin!(learned);
            learned.as_mut().enable();
            if let Some(replica) = self.far_enough(min) {
                return Choice::Replica(replica);
            }
            if tokio::time::timeout_at(deadline, learned).await.is_err() {
                return Choice::Primary(Reason::Behind);
            }
        }
    }

    /// A fit replica that has replayed at least `min`, the next in turn.
    fn far_enough(&self, min: u64) -> Option<&Replica> {
        let count = self.nodes.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..count)
            .map(|offset| &self.nodes[(start + offset) % count])
            .find(|r| r.watch.fit(self.max_lag) && r.watch.replayed() >= min)
    }

    /// Counts one read served by `served_by` for `reason`.
    pub(super) fn served(&self, served_by: ServedBy, reason: Reason) {
        let by = usize::from(served_by == ServedBy::Primary);
        let why = Reason::ALL
            .iter()
            .position(|&r| r == reason)
            .unwrap_or_default();
        self.served[by][why].fetch_add(1, Ordering::Relaxed);
    }

    /// The replicas' state and the reads counted, for the metrics.
    pub(super) fn report(&self) -> ReplicaReport {
        self.watch();
        let replicas = self
            .nodes
            .iter()
            .map(|r| ReplicaState {
                healthy: r.watch.healthy.load(Ordering::Acquire),
                #[expect(
                    clippy::cast_precision_loss,
                    reason = "milliseconds of lag are far below 2^52"
                )]
                lag_seconds: r.watch.lag_ms.load(Ordering::Acquire) as f64 / 1000.0,
            })
            .collect();
        let mut reads = Vec::new();
        for (by, name) in [(0, "replica"), (1, "primary")] {
            for (why, reason) in Reason::ALL.iter().enumerate() {
                let count = self.served[by][why].load(Ordering::Relaxed);
                if count > 0 {
                    reads.push((name, reason.as_str(), count));
                }
            }
        }
        ReplicaReport { replicas, reads }
    }

    /// The replicas' pools, to close with the engine.
    pub(super) fn pools(&self) -> impl Iterator<Item = &Arc<Inner>> {
        self.nodes.iter().map(|r| &r.inner)
    }
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("replicas", &self.nodes.len())
            .field("max_lag", &self.max_lag)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// How many samples of the primary's position a watcher keeps: enough to tell a lag of twice
/// `--max-replica-lag`.
fn samples_for(max_lag: Duration) -> usize {
    let span = max_lag.saturating_mul(2).as_millis() / SAMPLE_EVERY.as_millis();
    usize::try_from(span).unwrap_or(usize::MAX).clamp(16, 4096)
}

/// A read waiting for a replica, counted while it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn start(waiting: &'a AtomicUsize, wake: &Notify) -> Waiting<'a> {
        waiting.fetch_add(1, Ordering::AcqRel);
        wake.notify_waiters();
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The task that keeps one replica's [`Watch`] up to date, until its pool is gone or closed.
struct Watcher {
    index: usize,
    replica: Weak<Inner>,
    watch: Arc<Watch>,
    monitor: wire::Target,
    primary: wire::Target,
    log: Arc<PrimaryLog>,
    waiting: Arc<AtomicUsize>,
    wake: Arc<Notify>,
    learned: Arc<Notify>,
    /// When the primary was where: `(when, position)`, oldest first.
    samples: Mutex<VecDeque<(Instant, u64)>>,
    keep: usize,
}

/// What one look at a replica found.
struct Seen {
    /// It is in recovery (still a replica, not promoted) and has replayed this far.
    replayed: Option<u64>,
}

impl Watcher {
    async fn run(self) {
        let mut replica: Option<Client> = None;
        let mut primary: Option<Client> = None;
        let mut first = true;
        // Whether the replica was last found to replay the primary's history (see
        // [`Watcher::check_history`]), and when: checked again on every new connection to
        // either, and every [`HISTORY_EVERY`].
        let mut history: Option<(bool, Instant)> = None;
        loop {
            match self.replica.upgrade() {
                Some(inner) if !inner.closing.load(Ordering::Acquire) => {}
                _ => return,
            }
            let was_connected = is_open(&primary) && is_open(&replica);
            if let Some(position) = ask(&mut primary, &self.primary, PRIMARY_POSITION).await {
                self.log.saw(position);
                self.sample(position);
            }
            let seen = look(&mut replica, &self.monitor).await;
            let due = history.is_none_or(|(_, at)| at.elapsed() >= HISTORY_EVERY);
            if seen.is_some() && (!was_connected || due) {
                // Unanswered, the last verdict stands (none: not fit) and is due again; the
                // connection that did not answer was dropped, so the next look reconnects.
                if let Some(same) = self
                    .check_history(&mut primary, &mut replica, history.map(|(same, _)| same))
                    .await
                {
                    history = Some((same, Instant::now()));
                }
            }
            let same = history.is_some_and(|(same, _)| same);
            // A replica of another history is not fit, whatever it answers (and said why).
            let refused = seen.is_some() && !same;
            self.learn(seen.as_ref().filter(|_| same), first && !refused);
            first = false;
            self.learned.notify_waiters();
            if self.waiting.load(Ordering::Acquire) > 0 {
                tokio::time::sleep(WATCH_WAITED_EVERY).await;
            } else {
                tokio::select! {
                    () = tokio::time::sleep(WATCH_EVERY) => {}
                    () = self.wake.notified() => {}
                }
            }
        }
    }

    /// Whether the replica replays the primary's history: the same `system_identifier` (a
    /// standby of this cluster, not of another whose log positions mean nothing here) and the
    /// same timeline (not a standby left on a history the primary has branched from). `None`
    /// when either did not answer. A change of verdict from `before` is logged.
    async fn check_history(
        &self,
        primary: &mut Option<Client>,
        replica: &mut Option<Client>,
        before: Option<bool>,
    ) -> Option<bool> {
        let primary = history_of(primary, &self.primary, PRIMARY_HISTORY).await?;
        let replica = history_of(replica, &self.monitor, REPLICA_HISTORY).await?;
        let same = primary == replica;
        if !same && before != Some(false) {
            if primary.system == replica.system {
                tracing::warn!(
                    replica = self.index,
                    primary_timeline = primary.timeline,
                    replica_timeline = replica.timeline,
                    "a --read-replica is on another timeline than the primary (a failover it \
                     has not followed yet, or a branched history): it serves no reads until \
                     they match"
                );
            } else {
                tracing::error!(
                    replica = self.index,
                    primary_system = %primary.system,
                    replica_system = %replica.system,
                    "a --read-replica is a standby of another cluster (its system_identifier \
                     is not the primary's): it never serves reads"
                );
            }
        } else if same && before == Some(false) {
            tracing::info!(
                replica = self.index,
                "a --read-replica now replays the primary's history"
            );
        }
        Some(same)
    }

    fn sample(&self, position: u64) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match samples.back_mut() {
            // Within a sample's span only the latest position is kept.
            Some((when, at)) if now.duration_since(*when) < SAMPLE_EVERY => {
                *at = (*at).max(position)
            }
            _ => samples.push_back((now, position)),
        }
        while samples.len() > self.keep {
            samples.pop_front();
        }
    }

    /// How far behind the primary a replica that replayed `replayed` is: since the earliest
    /// sample where the primary was past it (nothing when it has what the primary last had).
    fn lag(&self, replayed: u64) -> Duration {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples
            .iter()
            .find(|&&(_, at)| at > replayed)
            .map_or(Duration::ZERO, |&(when, _)| when.elapsed())
    }

    fn learn(&self, seen: Option<&Seen>, first: bool) {
        if first && let Some(Seen { replayed: None }) = seen {
            tracing::warn!(
                replica = self.index,
                "a --read-replica is not in recovery (not a streaming replica, or promoted): it \
                 serves no reads"
            );
        }
        if first && seen.is_none() {
            tracing::warn!(
                replica = self.index,
                "cannot reach a --read-replica (its URL's role logs in to watch it): it serves \
                 no reads until it answers"
            );
        }
        let replayed = seen.and_then(|seen| seen.replayed);
        let healthy = replayed.is_some();
        if let Some(replayed) = replayed {
            // Not the greatest seen: a replica that restarted may be back further (and its
            // reads check again how far it is, before their snapshot).
            self.watch.replayed.store(replayed, Ordering::Release);
            let lag = u64::try_from(self.lag(replayed).as_millis()).unwrap_or(u64::MAX);
            self.watch.lag_ms.store(lag, Ordering::Release);
        }
        let was = self.watch.healthy.swap(healthy, Ordering::AcqRel);
        if was && !healthy {
            tracing::warn!(
                replica = self.index,
                "a read replica stopped answering or replaying; its reads go elsewhere"
            );
            self.watch.gone.notify_waiters();
        } else if !was && healthy {
            tracing::info!(replica = self.index, "a read replica serves reads");
        }
    }
}

/// The primary's position now.
const PRIMARY_POSITION: &str = "SELECT pg_catalog.pg_current_wal_lsn()::pg_catalog.text";

/// How often a watcher checks again that its replica replays the primary's history, besides
/// each time it connects anew to either (see [`Watcher::check_history`]).
const HISTORY_EVERY: Duration = Duration::from_secs(10);

/// The primary's cluster and timeline: the timeline is the one its log is written on now (the
/// first eight hex digits of the current WAL file's name), exact even right after a promotion,
/// when the control file's checkpoint still names the one before.
const PRIMARY_HISTORY: &str = "SELECT s.system_identifier::pg_catalog.text, \
pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()) \
FROM pg_catalog.pg_control_system() AS s";

/// A replica's cluster and timeline: the furthest of its last restartpoint's, its minimum
/// recovery point's and, when the watching role may see it, the timeline it receives. A standby
/// that followed a promotion may name the old timeline until its next restartpoint (when the
/// watching role cannot read `pg_stat_wal_receiver`): it serves no reads meanwhile, which is
/// the safe side.
const REPLICA_HISTORY: &str = "SELECT s.system_identifier::pg_catalog.text, \
GREATEST(c.timeline_id, r.min_recovery_end_timeline, \
(SELECT w.received_tli FROM pg_catalog.pg_stat_wal_receiver AS w))::pg_catalog.text \
FROM pg_catalog.pg_control_system() AS s, pg_catalog.pg_control_checkpoint() AS c, \
pg_catalog.pg_control_recovery() AS r";

/// Which cluster a node belongs to (`pg_control_system().system_identifier`, chosen at
/// `initdb` and kept by every standby made from it) and which timeline of its history it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct History {
    pub(super) system: String,
    pub(super) timeline: u32,
}

impl History {
    /// From a row of [`PRIMARY_HISTORY`] or [`REPLICA_HISTORY`]: the system identifier, and a
    /// timeline as a number or as a WAL file's name (whose first eight hex digits it is).
    fn parse(system: Option<&str>, timeline: Option<&str>) -> Option<History> {
        let system = system?.to_owned();
        let timeline = timeline?;
        let timeline = if timeline.len() == 24 {
            u32::from_str_radix(timeline.get(..8)?, 16).ok()?
        } else {
            timeline.parse().ok()?
        };
        Some(History { system, timeline })
    }
}

/// The history `sql` ([`PRIMARY_HISTORY`] or [`REPLICA_HISTORY`]) reads on `client`, opened to
/// `target` when needed; `None` (and the connection dropped) without an answer in time.
async fn history_of(
    client: &mut Option<Client>,
    target: &wire::Target,
    sql: &str,
) -> Option<History> {
    let answer = tokio::time::timeout(PROBE_WITHIN, async {
        let connection = connected(client, target).await?;
        let rows = connection.simple_query(sql).await.ok()?;
        let row = rows.iter().find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })?;
        History::parse(row.get(0), row.get(1))
    })
    .await
    .ok()
    .flatten();
    if answer.is_none() {
        *client = None;
    }
    answer
}

/// The system identifier of the node at `target`, asked on a connection of its own.
pub(super) async fn system_of(target: &wire::Target) -> Result<String, String> {
    let ask = async {
        let (client, driver) = wire::connect(target).await.map_err(|e| e.to_string())?;
        let row = client
            .query_one(
                "SELECT system_identifier::pg_catalog.text FROM pg_catalog.pg_control_system()",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        let system = row.get::<_, String>(0);
        // Ended before the server starts serving: no session of the check outlives it.
        drop(client);
        let _ = driver.await;
        Ok(system)
    };
    tokio::time::timeout(super::CONNECT_WITHIN, ask)
        .await
        .unwrap_or_else(|_| Err("no answer in time".to_owned()))
}

/// Refuses to start with a `--read-replica` that answers and is a standby of another cluster
/// than the primary (`url` and `target` each): its reads would be another database's, and its
/// log positions compared with the primary's would mean nothing. A replica that does not answer
/// now is let be: its watcher checks it when it does, and never uses it if it is another's.
/// Runs on a thread of its own, as the set-up does (start is not async).
pub(super) fn check_at_start(
    primary: &wire::Target,
    replicas: &[(String, &wire::Target)],
) -> Result<(), crate::error::ServerError> {
    let primary = wire::Target {
        config: primary.config.clone(),
        tls: Arc::clone(&primary.tls),
    };
    let replicas: Vec<(String, wire::Target)> = replicas
        .iter()
        .map(|(url, target)| {
            (
                url.clone(),
                wire::Target {
                    config: target.config.clone(),
                    tls: Arc::clone(&target.tls),
                },
            )
        })
        .collect();
    let checked = std::thread::Builder::new()
        .name("sqlhttpd-pg-replicas".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| (String::new(), format!("cannot start a runtime: {e}")))?;
            runtime.block_on(async {
                let ours = system_of(&primary).await.map_err(|e| {
                    (
                        String::new(),
                        format!("cannot read the primary's system_identifier: {e}"),
                    )
                })?;
                for (index, (url, target)) in replicas.iter().enumerate() {
                    match system_of(target).await {
                        Ok(theirs) if theirs == ours => {}
                        Ok(theirs) => {
                            return Err((
                                url.clone(),
                                format!(
                                    "this --read-replica is not a standby of the --database \
                                     primary: its system_identifier is {theirs}, the primary's \
                                     {ours} (another cluster's standby: its rows are another \
                                     database's and its log positions mean nothing here); \
                                     remove it, or point it at a standby of the primary"
                                ),
                            ));
                        }
                        Err(why) => tracing::warn!(
                            replica = index,
                            error = %why,
                            "cannot ask a --read-replica which cluster it belongs to at start: \
                             it serves no reads until its watcher finds it a standby of the \
                             primary"
                        ),
                    }
                }
                Ok(())
            })
        })
        .map_err(crate::error::ServerError::EngineThread)?
        .join()
        .unwrap_or_else(|_| Err((String::new(), "the replica check panicked".to_owned())));
    checked.map_err(|(database, reason)| crate::error::ServerError::Postgres { database, reason })
}

fn is_open(client: &Option<Client>) -> bool {
    client.as_ref().is_some_and(|client| !client.is_closed())
}

/// Asks `sql` (one position) on the connection `client`, opening it to `target` when needed;
/// `None` (and the connection dropped) when there is no answer in time.
pub(super) async fn ask(
    client: &mut Option<Client>,
    target: &wire::Target,
    sql: &str,
) -> Option<u64> {
    let answer = tokio::time::timeout(PROBE_WITHIN, async {
        let connection = connected(client, target).await?;
        let rows = connection.simple_query(sql).await.ok()?;
        super::transaction::first_position(&rows).map(Bookmark::position)
    })
    .await
    .ok()
    .flatten();
    if answer.is_none() {
        *client = None;
    }
    answer
}

/// How a replica is: `None` when it does not answer in time.
async fn look(client: &mut Option<Client>, target: &wire::Target) -> Option<Seen> {
    let seen = tokio::time::timeout(PROBE_WITHIN, async {
        let connection = connected(client, target).await?;
        let rows = connection
            .simple_query(
                "SELECT pg_catalog.pg_is_in_recovery()::pg_catalog.text, \
                 pg_catalog.pg_last_wal_replay_lsn()::pg_catalog.text",
            )
            .await
            .ok()?;
        let row = rows.iter().find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })?;
        let in_recovery = row.get(0) == Some("true");
        let replayed = row
            .get(1)
            .and_then(crate::protocol::bookmark::from_lsn)
            .map(Bookmark::position);
        Some(Seen {
            replayed: replayed.filter(|_| in_recovery),
        })
    })
    .await
    .ok()
    .flatten();
    if seen.is_none() {
        *client = None;
    }
    seen
}

async fn connected<'a>(
    client: &'a mut Option<Client>,
    target: &wire::Target,
) -> Option<&'a Client> {
    if client.as_ref().is_some_and(Client::is_closed) {
        *client = None;
    }
    if client.is_none() {
        let (connection, _driver) = wire::connect(target).await.ok()?;
        *client = Some(connection);
    }
    client.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histories_are_read_from_a_wal_file_name_or_a_number() {
        let primary = History::parse(
            Some("7715065122081851108"),
            Some("0000000A0000000000000004"),
        );
        assert_eq!(
            primary,
            Some(History {
                system: "7715065122081851108".to_owned(),
                timeline: 10
            })
        );
        assert_eq!(
            History::parse(Some("7715065122081851108"), Some("10")),
            primary
        );
        assert_ne!(
            History::parse(Some("7715065122081851108"), Some("1")),
            primary
        );
        assert_ne!(History::parse(Some("1"), Some("10")), primary);
        assert_eq!(History::parse(None, Some("10")), None);
        assert_eq!(History::parse(Some("1"), Some("x")), None);
    }

    #[test]
    fn lag_samples_cover_twice_the_limit() {
        assert_eq!(samples_for(Duration::from_secs(5)), 100);
        assert_eq!(samples_for(Duration::ZERO), 16);
        assert_eq!(samples_for(Duration::from_secs(86_400)), 4096);
    }
}
