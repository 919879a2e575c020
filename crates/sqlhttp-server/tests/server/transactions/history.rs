//! A history checker for interactive transactions whose every COMMIT answer is lost once
//! (issue 35, finding 2), on PostgreSQL with two streaming replicas that lag.
//!
//! One in-process `sqlhttpd` on the primary, its `--read-replica`s the cluster's replicas with a
//! short `--replica-wait`, so that a read whose bookmark no replica has reached in time is
//! served by the primary. Several sessions run at once, each an SDK client behind a
//! [`ChaosProxy`] of its own (the proxy's plan is one FIFO for every request through it, so one
//! proxy per session keeps "the next request is this session's COMMIT" exact). Each session
//! loops: a transaction inserting one row of its own, `(session, seq)`, through
//! [`Client::transact`] or an explicit [`Client::transaction`] and `commit()`, with the proxy
//! planned to forward the COMMIT and drop its answer, so the SDK sends it again (or asks for its
//! outcome) and is answered from the stored outcome; then, once the transaction returned `Ok`,
//! a verified read of the session's rows through the same client. Meanwhile one replica at a
//! time has its WAL replay paused for a few hundred milliseconds (always resumed, even when the
//! test fails).
//!
//! The history is checked at the end:
//!
//! - **read-your-writes**: every read after an `Ok` transaction saw every row its session had
//!   committed (an answer to a re-sent COMMIT that carries no bookmark lets the SDK keep an older
//!   one, and the read is then served by a replica that has not replayed the commit);
//! - **no duplicated effect**: each `(session, seq)` is on the primary at most once (no unique
//!   key stops a second insert: the table shows whatever ran);
//! - **no lost effect**: every `Ok` transaction's row is on the primary exactly once, one whose
//!   outcome the SDK reported unknown at most once, one reported failed (lost before it
//!   committed) not at all.
//!
//! The figures are printed to stderr. The workload runs for [`WORKLOAD`] (about 15 s; set
//! `SQLHTTPD_TEST_TX_HISTORY_SECS` for longer). The cluster is [`replica_cluster`]'s, shared by
//! the test process: pausing its replicas disturbs every database on them, so this test holds
//! [`REPLICAS`] exclusively, as the replica tests that pause one do. It skips as they do.
//!
//! Alone, with its figures: `cargo test -p sqlhttp-server --test server tx_history --
//! --nocapture` (on a cluster of its own from `scripts/start-postgres --replica 2`, or the one
//! named by `SQLHTTPD_TEST_POSTGRES_URL` and `SQLHTTPD_TEST_POSTGRES_REPLICA_URLS`). On the code
//! before issue 35's fixes it found 59-69 read-your-writes violations in 681-778 transactions.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlhttp::{Client, RetryPolicy};
use sqlhttp_server::{Config, Database, ReadReplicas, Server};
use sqlhttp_testkit::{ChaosProxy, Fault};

use crate::common::http_client;
use crate::engines::{ReplicaCluster, client_role, config, needs_postgres, owner, replica_cluster};
use crate::replicas::reads::REPLICAS;

/// How long the sessions run transactions, unless `SQLHTTPD_TEST_TX_HISTORY_SECS` says.
const WORKLOAD: Duration = Duration::from_secs(15);

/// Sessions running at once, each with its own client and proxy.
const SESSIONS: u64 = 6;

/// How long a read waits for a replica to reach its bookmark before the primary serves it.
const REPLICA_WAIT: Duration = Duration::from_millis(50);

/// The table every session writes its rows to. No unique key: a second run of a transaction's
/// insert would show as a second row.
const TABLE: &str = "CREATE TABLE history (session BIGINT NOT NULL, seq BIGINT NOT NULL)";

/// How a transaction ended, as the SDK reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// `Ok`: it committed, exactly once.
    Committed,
    /// An error with `is_outcome_unknown()`: it may have committed.
    Unknown,
    /// Any other error: nothing of it was committed.
    Failed,
}

/// One read of a session's rows after an `Ok` transaction, and what it missed.
#[derive(Debug)]
struct Violation {
    session: u64,
    /// The transaction the read followed.
    after: u64,
    /// Rows the session had committed that the read did not see.
    missing: Vec<u64>,
    /// How many rows it saw.
    seen: usize,
}

/// What one session did and saw.
#[derive(Debug, Default)]
struct SessionHistory {
    /// Every transaction's `seq` and how it ended.
    ended: BTreeMap<u64, Ended>,
    /// COMMIT answers the proxy dropped.
    dropped: usize,
    /// Requests the SDK sent after a dropped COMMIT answer, until the call returned: each a
    /// re-sent COMMIT (or a question for its outcome).
    resent: usize,
    /// Reads after an `Ok` transaction.
    reads: usize,
    /// Reads that failed.
    read_errors: Vec<String>,
    /// Reads that missed a committed row.
    violations: Vec<Violation>,
    /// Reads that saw a row of a transaction reported failed, or one row twice.
    phantoms: Vec<String>,
    /// Errors of the transactions that failed, their outcome known or not.
    errors: Vec<String>,
}

needs_postgres! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_commit_answered_twice_keeps_read_your_writes_and_each_effect_once() {
        let test = "every_commit_answered_twice_keeps_read_your_writes_and_each_effect_once";
        let Some(cluster) = replica_cluster(test) else {
            return;
        };
        let _exclusive = REPLICAS.write().await;
        let _alone = crate::common::MACHINE.write().await;
        // However the test ends, the replicas replay again for the tests after it.
        let _resumed = ResumeOnDrop(cluster.replicas.clone());
        let database = cluster.database().await;

        let mut config: Config = config(&database.primary);
        config.listen = "127.0.0.1:0".parse().unwrap();
        let role = client_role(&database.primary);
        config.read_replicas = ReadReplicas {
            urls: database
                .replicas
                .iter()
                .map(|url| match url.parse() {
                    Ok(Database::Postgres(url)) => url.with_client_role(&role).unwrap(),
                    _ => panic!("a PostgreSQL URL: {url}"),
                })
                .collect(),
            wait: REPLICA_WAIT,
            ..ReadReplicas::default()
        };
        let server = Server::bind(config).await.unwrap().spawn();
        let addr = server.local_addr();
        let url = server.url();

        let direct = Client::builder(url.clone()).build().unwrap();
        direct.execute(TABLE).await.unwrap();
        database.caught_up().await;
        every_replica_serving(&url, database.replicas.len()).await;
        let replica_reads_before = reads_served_by(&url, "replica").await;
        let primary_reads_before = reads_served_by(&url, "primary").await;

        let workload = std::env::var("SQLHTTPD_TEST_TX_HISTORY_SECS")
            .ok()
            .and_then(|secs| secs.parse().ok())
            .map_or(WORKLOAD, Duration::from_secs);
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let lagging = tokio::spawn(lag_replicas(cluster, Arc::clone(&stop)));
        let mut sessions = Vec::new();
        for session in 1..=SESSIONS {
            let proxy = ChaosProxy::start(addr).await.unwrap();
            sessions.push(tokio::spawn(run_session(
                session,
                proxy,
                started + workload,
            )));
        }
        let mut histories = Vec::new();
        for session in sessions {
            histories.push(session.await.unwrap());
        }
        stop.store(true, Ordering::SeqCst);
        let lag = lagging.await.unwrap();
        let elapsed = started.elapsed();
        let replica_reads = reads_served_by(&url, "replica").await - replica_reads_before;
        let primary_reads = reads_served_by(&url, "primary").await - primary_reads_before;

        // What the primary holds, counted per row.
        let mut stored: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for row in owner(&database.primary)
            .await
            .query(
                "SELECT session, seq, count(*) FROM history GROUP BY session, seq",
                &[],
            )
            .await
            .unwrap()
        {
            let key = (
                u64::try_from(row.get::<_, i64>(0)).unwrap(),
                u64::try_from(row.get::<_, i64>(1)).unwrap(),
            );
            stored.insert(key, u64::try_from(row.get::<_, i64>(2)).unwrap());
        }
        server.shutdown().await;

        let mut figures = Figures::default();
        for (history, session) in histories.iter().zip(1..) {
            figures.add(session, history, &stored);
        }
        let unexpected_rows: Vec<_> = stored
            .keys()
            .filter(|(session, seq)| {
                !histories
                    .iter()
                    .zip(1..)
                    .any(|(history, s)| s == *session && history.ended.contains_key(seq))
            })
            .collect();
        eprintln!(
            "tx_history: {SESSIONS} sessions for {elapsed:.1?} (each COMMIT's first answer dropped, \
         --replica-wait {REPLICA_WAIT:?}): {transactions} transactions ({committed} ok, \
         {unknown} outcome unknown, {failed} failed), {dropped} COMMIT answers dropped, \
         {resent} requests re-sent after them (re-sent COMMITs or outcome questions); \
         {reads} reads after an ok transaction ({replica_reads} reads served by replicas, \
         {primary_reads} by the primary, {read_errors} failed); replicas paused {pauses} times, \
         {paused:.1?} in all; read-your-writes violations {violations}, duplicated effects \
         {duplicated}, lost effects {lost}, effects of failed transactions {phantom}, rows seen \
         twice or of failed transactions {seen_wrong}, rows no transaction wrote {unexpected}",
            transactions = figures.transactions,
            committed = figures.committed,
            unknown = figures.unknown,
            failed = figures.failed,
            dropped = figures.dropped,
            resent = figures.resent,
            reads = figures.reads,
            read_errors = figures.read_errors,
            pauses = lag.pauses,
            paused = lag.paused,
            violations = figures.violations,
            duplicated = figures.duplicated,
            lost = figures.lost,
            phantom = figures.phantom,
            seen_wrong = figures.seen_wrong,
            unexpected = unexpected_rows.len(),
        );

        for error in histories.iter().flat_map(|h| &h.errors).take(5) {
            eprintln!("tx_history: a transaction failed (not a violation by itself): {error}");
        }
        let mut failures = String::new();
        for history in &histories {
            for violation in history.violations.iter().take(5) {
                let _ = writeln!(
                    failures,
                    "session {} read after transaction {} saw {} rows and missed {:?}",
                    violation.session, violation.after, violation.seen, violation.missing
                );
            }
            for wrong in history.phantoms.iter().take(5) {
                let _ = writeln!(failures, "{wrong}");
            }
            for error in history.read_errors.iter().take(3) {
                let _ = writeln!(failures, "a read failed: {error}");
            }
        }
        for problem in figures.problems.iter().take(20) {
            let _ = writeln!(failures, "{problem}");
        }
        for row in unexpected_rows.iter().take(5) {
            let _ = writeln!(
                failures,
                "the primary holds {row:?}, which no transaction wrote"
            );
        }
        assert!(failures.is_empty(), "the history is not clean:\n{failures}");
        assert!(
            figures.committed > SESSIONS as usize * 10,
            "too few transactions to check anything: {}",
            figures.committed
        );
        assert!(
            figures.dropped >= figures.committed + figures.unknown,
            "every transaction that reached its COMMIT lost the COMMIT's first answer"
        );
        assert!(
            figures.resent >= figures.dropped,
            "every dropped answer was asked for again"
        );
        assert!(replica_reads > 0.0, "no read was served by a replica");
    }
}

/// The history's figures, summed over the sessions.
#[derive(Debug, Default)]
struct Figures {
    transactions: usize,
    committed: usize,
    unknown: usize,
    failed: usize,
    dropped: usize,
    resent: usize,
    reads: usize,
    read_errors: usize,
    violations: usize,
    seen_wrong: usize,
    duplicated: usize,
    lost: usize,
    phantom: usize,
    /// What broke, one line each.
    problems: Vec<String>,
}

impl Figures {
    /// Adds `session`'s history, checked against what the primary holds.
    fn add(&mut self, session: u64, history: &SessionHistory, stored: &BTreeMap<(u64, u64), u64>) {
        self.transactions += history.ended.len();
        self.dropped += history.dropped;
        self.resent += history.resent;
        self.reads += history.reads;
        self.read_errors += history.read_errors.len();
        self.violations += history.violations.len();
        self.seen_wrong += history.phantoms.len();
        for (&seq, &ended) in &history.ended {
            let copies = stored.get(&(session, seq)).copied().unwrap_or(0);
            if copies > 1 {
                self.duplicated += 1;
                self.problems.push(format!(
                    "session {session} transaction {seq} ({ended:?}) is on the primary {copies} times"
                ));
            }
            match ended {
                Ended::Committed => {
                    self.committed += 1;
                    if copies == 0 {
                        self.lost += 1;
                        self.problems.push(format!(
                            "session {session} transaction {seq} answered Ok is not on the primary"
                        ));
                    }
                }
                Ended::Unknown => self.unknown += 1,
                Ended::Failed => {
                    self.failed += 1;
                    if copies > 0 {
                        self.phantom += 1;
                        self.problems.push(format!(
                            "session {session} transaction {seq} reported failed is on the primary"
                        ));
                    }
                }
            }
        }
    }
}

/// A client through `proxy` that retries quickly and without a budget: every COMMIT needs a
/// second attempt here, which is what is being tested, not the budget.
fn session_client(proxy: &ChaosProxy) -> Client {
    Client::builder(proxy.url())
        .retry(
            RetryPolicy::new()
                .with_max_attempts(10)
                .with_initial_backoff(Duration::from_millis(5))
                .with_max_backoff(Duration::from_millis(50)),
        )
        .retry_budget(None)
        .build()
        .unwrap()
}

/// One session: transactions and reads until `deadline`.
async fn run_session(session: u64, proxy: ChaosProxy, deadline: Instant) -> SessionHistory {
    let proxy = Arc::new(proxy);
    let client = session_client(&proxy);
    let mut history = SessionHistory::default();
    let mut committed: BTreeSet<u64> = BTreeSet::new();
    let mut seq = 0;
    while Instant::now() < deadline {
        seq += 1;
        // The proxy's request count when the first drop was planned: the next request is the
        // COMMIT.
        let planned_at = Arc::new(AtomicUsize::new(usize::MAX));
        let planned = Arc::new(AtomicUsize::new(0));
        let result = if seq % 2 == 0 {
            client
                .transact(|tx| {
                    let proxy = Arc::clone(&proxy);
                    let planned_at = Arc::clone(&planned_at);
                    let planned = Arc::clone(&planned);
                    async move {
                        tx.execute("INSERT INTO history (session, seq) VALUES (?, ?)")
                            .bind(session)
                            .bind(seq)
                            .await?;
                        // The first run's COMMIT: a run that `transact` makes again (its
                        // transaction lost: a serialization failure at COMMIT) drops its own
                        // COMMIT's answer too, and its requests count among those after the
                        // first drop.
                        let _ = planned_at.compare_exchange(
                            usize::MAX,
                            proxy.requests(),
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                        planned.fetch_add(1, Ordering::SeqCst);
                        proxy.push(Fault::DropAfterForward);
                        Ok(())
                    }
                })
                .await
        } else {
            explicit(&client, &proxy, session, seq, &planned_at, &planned).await
        };
        // A drop planned for a COMMIT that was never sent must not hit the read.
        let unused = proxy.pending();
        proxy.clear();
        history.dropped += planned.load(Ordering::SeqCst) - unused;
        let at = planned_at.load(Ordering::SeqCst);
        if at != usize::MAX && unused == 0 {
            // The dropped COMMIT, then every request the SDK sent after it.
            history.resent += proxy.requests().saturating_sub(at + 1);
        }
        let ended = match &result {
            Ok(()) => Ended::Committed,
            Err(err) if err.is_outcome_unknown() => Ended::Unknown,
            Err(_) => Ended::Failed,
        };
        history.ended.insert(seq, ended);
        if let Err(err) = result {
            history.errors.push(format!("transaction {seq}: {err}"));
            continue;
        }
        committed.insert(seq);

        // Read your writes, at once, through the same client.
        history.reads += 1;
        let seen: Vec<i64> = match client
            .query("SELECT seq FROM history WHERE session = ?")
            .bind(session)
            .fetch_all()
            .await
        {
            Ok(seen) => seen,
            Err(err) => {
                history.read_errors.push(format!("after {seq}: {err}"));
                continue;
            }
        };
        let seen_set: BTreeSet<u64> = seen.iter().map(|&s| u64::try_from(s).unwrap()).collect();
        if seen_set.len() != seen.len() {
            history.phantoms.push(format!(
                "session {session} read after transaction {seq} saw a row twice: {seen:?}"
            ));
        }
        for row in &seen_set {
            if history.ended.get(row) == Some(&Ended::Failed) {
                history.phantoms.push(format!(
                    "session {session} read after transaction {seq} saw the row of transaction \
                     {row}, reported failed"
                ));
            }
        }
        let missing: Vec<u64> = committed.difference(&seen_set).copied().collect();
        if !missing.is_empty() {
            history.violations.push(Violation {
                session,
                after: seq,
                missing,
                seen: seen.len(),
            });
        }
    }
    history
}

/// A transaction through [`Client::transaction`], its COMMIT's answer dropped.
async fn explicit(
    client: &Client,
    proxy: &ChaosProxy,
    session: u64,
    seq: u64,
    planned_at: &AtomicUsize,
    planned: &AtomicUsize,
) -> sqlhttp::Result<()> {
    let tx = client.transaction().await?;
    tx.execute("INSERT INTO history (session, seq) VALUES (?, ?)")
        .bind(session)
        .bind(seq)
        .await?;
    planned_at.store(proxy.requests(), Ordering::SeqCst);
    planned.fetch_add(1, Ordering::SeqCst);
    proxy.push(Fault::DropAfterForward);
    tx.commit().await
}

/// How long the replicas were made to lag.
#[derive(Debug, Default)]
struct Lag {
    pauses: usize,
    paused: Duration,
}

/// Until `stop`: every 100-400 ms, one replica (in turn) has its WAL replay paused for
/// 150-450 ms, then resumed.
async fn lag_replicas(cluster: &'static ReplicaCluster, stop: Arc<AtomicBool>) -> Lag {
    let mut lag = Lag::default();
    let mut random = SplitMix(u64::from(std::process::id()));
    let mut turn = 0;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100 + random.below(300))).await;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let replica = &cluster.replicas[turn % cluster.replicas.len()];
        turn += 1;
        let hold = Duration::from_millis(150 + random.below(300));
        let paused = Paused::pause(replica).await;
        let since = Instant::now();
        tokio::time::sleep(hold).await;
        paused.resume().await;
        lag.pauses += 1;
        lag.paused += since.elapsed();
    }
    lag
}

/// A small deterministic random source (SplitMix64), enough for timings.
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound
    }
}

/// A replica whose WAL replay is paused (as the superuser, at its `postgres` database URL);
/// resumed by [`Paused::resume`] or on drop.
struct Paused {
    replica: Option<String>,
}

impl Paused {
    async fn pause(replica: &str) -> Paused {
        owner(replica)
            .await
            .execute("SELECT pg_wal_replay_pause()", &[])
            .await
            .unwrap();
        Paused {
            replica: Some(replica.to_owned()),
        }
    }

    async fn resume(mut self) {
        if let Some(replica) = self.replica.take() {
            resume(&replica).await;
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if let Some(replica) = self.replica.take() {
            resume_blocking(vec![replica]);
        }
    }
}

/// Resumes every replica's replay when dropped, however the test ends.
struct ResumeOnDrop(Vec<String>);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        resume_blocking(self.0.clone());
    }
}

async fn resume(replica: &str) {
    owner(replica)
        .await
        .execute("SELECT pg_wal_replay_resume()", &[])
        .await
        .unwrap();
}

/// Resumes `replicas` from a thread of its own (a drop may run inside or outside a runtime, and
/// while the test panics).
fn resume_blocking(replicas: Vec<String>) {
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                for replica in &replicas {
                    resume(replica).await;
                }
            });
    })
    .join();
}

/// `sqlhttpd_replica_reads_total` served by `served_by` (`replica` or `primary`), over every
/// reason, from the server's `/metrics`.
async fn reads_served_by(url: &str, served_by: &str) -> f64 {
    let text = http_client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let label = format!("served_by=\"{served_by}\"");
    text.lines()
        .filter(|line| line.starts_with("sqlhttpd_replica_reads_total{") && line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the server at `url` reports `count` replicas, all healthy, and a read is served
/// by one.
async fn every_replica_serving(url: &str, count: usize) {
    let client = Client::builder(url).build().unwrap();
    let started = Instant::now();
    loop {
        let text = http_client()
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let healthy: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("sqlhttpd_replica_healthy{"))
            .collect();
        let before = reads_served_by(url, "replica").await;
        let _: i64 = client.query("SELECT 1").fetch_one().await.unwrap();
        if healthy.len() == count
            && healthy.iter().all(|line| line.ends_with(" 1"))
            && reads_served_by(url, "replica").await > before
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the replicas were not serving reads within 30 s: {healthy:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
