//! Read replicas and bookmarks (docs/protocol.md, issue 24) against real streaming replicas:
//! `sqlhttpd` run as a process with `--database` on a primary and `--read-replica` for its
//! hot standbys, asserted through HTTP alone (the `Sqlhttp-Served-By` and `Sqlhttp-Bookmark`
//! headers, the bodies, `/metrics`, `/readyz`). Faults are real too: a replica's replay paused
//! (`pg_wal_replay_pause()`), a replica stopped (`pg_ctl stop -m immediate`) and started again.
//!
//! The cluster is [`replica_cluster`]'s, shared by every test of the process: each test makes a
//! database of its own on it. A test that pauses or stops a replica affects every database on
//! it, so it holds [`REPLICAS`] exclusively while tests that only read it share the lock, and it
//! leaves the replica running and replaying however it ends (the guards below resume and
//! restart it on drop). These tests skip as the other PostgreSQL tests do.
//!
//! Waiting for a replica is bounded by generous deadlines that only turn a hang into a failure
//! with a message: no assertion depends on how long anything took.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sqlhttp_testkit::ServerProcess;
use tokio::sync::RwLock;

use crate::common::{READER, WRITER, http_client, post_over_http, sqlhttpd};
use crate::engines::{ReplicaDatabase, client_role, needs_postgres, owner, replica_cluster};

/// Held shared by the tests that leave the replicas alone, exclusively by those that pause or
/// stop one.
pub(crate) static REPLICAS: RwLock<()> = RwLock::const_new(());

/// How long a test waits for something a replica or the server does in the background (a
/// health check, a restart) before it fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// Skips the test (with a message) when there is no cluster with replicas.
macro_rules! replica_cluster_or_return {
    ($test:expr) => {
        match replica_cluster($test) {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// An answer, fully read.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }

    /// `Sqlhttp-Served-By`.
    fn served_by(&self) -> Option<&str> {
        self.header("sqlhttp-served-by")
    }

    /// `Sqlhttp-Bookmark`, checked to be 16 lower-case hex digits.
    fn bookmark(&self) -> String {
        let bookmark = self
            .header("sqlhttp-bookmark")
            .unwrap_or_else(|| panic!("no Sqlhttp-Bookmark on {self:?}"));
        assert!(
            bookmark.len() == 16
                && bookmark
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "a bookmark is 16 lower-case hex digits, not {bookmark:?}"
        );
        bookmark.to_owned()
    }

    /// The only cell of a one-row, one-column result.
    fn cell(&self) -> &Value {
        &self.body["rows"][0][0]
    }

    /// Asserts a 200 and returns the answer.
    fn ok(self) -> Answer {
        assert_eq!(self.status, 200, "{self:?}");
        self
    }
}

/// POSTs `body` to `path` on the server at `url` with `headers`.
async fn post(url: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let (status, headers, bytes) = post_over_http(&http_client(), url, path, headers, body).await;
    Answer {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// A write through the full-access credential, with `headers` besides.
async fn write(url: &str, sql: &str, params: Value, headers: &[(&str, &str)]) -> Answer {
    let mut all = WRITER.to_vec();
    all.extend_from_slice(headers);
    post(
        url,
        "/api/v1/sql",
        &all,
        &json!({"sql": sql, "params": params}),
    )
    .await
}

/// A verified read (`"read_only": true`) through the full-access credential, with `headers`.
async fn read(url: &str, sql: &str, params: Value, headers: &[(&str, &str)]) -> Answer {
    let mut all = WRITER.to_vec();
    all.extend_from_slice(headers);
    post(
        url,
        "/api/v1/sql",
        &all,
        &json!({"sql": sql, "params": params, "read_only": true}),
    )
    .await
}

/// The one value of table `kv`, read as a verified read.
async fn read_value(url: &str, headers: &[(&str, &str)]) -> Answer {
    read(url, "SELECT v FROM kv WHERE k = 1", json!([]), headers)
        .await
        .ok()
}

/// Sets the one value of table `kv`.
async fn set_value(url: &str, value: &str) -> Answer {
    write(url, "UPDATE kv SET v = $1 WHERE k = 1", json!([value]), &[])
        .await
        .ok()
}

/// `sqlhttpd` on `database`'s primary with the replicas numbered in `replicas` (indexes into
/// `database.replicas`), a full-access token `writer` and a read-only token `reader`, and
/// `extra` flags; killed on drop.
async fn sqlhttpd_on(
    database: &ReplicaDatabase,
    replicas: &[usize],
    extra: &[&str],
) -> ServerProcess {
    let mut command = sqlhttpd();
    command
        .args(["--database", &database.primary])
        .args(["--client-role", &client_role(&database.primary)])
        .args(["--token", "writer", "--read-token", "reader"]);
    for &replica in replicas {
        command.args(["--read-replica", &database.replicas[replica]]);
    }
    // ServerProcess reads stdout; stderr goes to the test's output, not to a pipe nobody reads.
    command.args(extra).stderr(Stdio::inherit());
    ServerProcess::spawn_command(command).await.unwrap()
}

/// `sqlhttpd` with every replica, once `kv` holds `value` on all of them.
async fn every_replica(database: &ReplicaDatabase, value: &str) -> ServerProcess {
    let replicas: Vec<usize> = (0..database.replicas.len()).collect();
    let server = sqlhttpd_on(database, &replicas, &[]).await;
    prepared(server.url(), database, replicas.len(), value).await;
    server
}

/// `sqlhttpd` with the first replica only, which its lag never sends reads away from (only a
/// bookmark does), waiting 50 ms for it.
async fn one_replica_never_too_far(database: &ReplicaDatabase) -> ServerProcess {
    sqlhttpd_on(
        database,
        &[0],
        &["--replica-wait", "50ms", "--max-replica-lag", "1h"],
    )
    .await
}

/// One `/metrics` answer, parsed enough to read series by name and labels (in any order).
struct Metrics(Vec<(String, BTreeMap<String, String>, f64)>);

impl Metrics {
    async fn of(url: &str) -> Metrics {
        let text = http_client()
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        Metrics(text.lines().filter_map(parse_sample).collect())
    }

    /// The values of the series named `name`, with their labels.
    fn series(&self, name: &str) -> Vec<(&BTreeMap<String, String>, f64)> {
        self.0
            .iter()
            .filter(|(series, _, _)| series == name)
            .map(|(_, labels, value)| (labels, *value))
            .collect()
    }

    /// The sum of the series named `name` whose labels include `labels` (0 when none does).
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(name)
            .into_iter()
            .filter(|(have, _)| {
                labels
                    .iter()
                    .all(|(key, value)| have.get(*key).map(String::as_str) == Some(*value))
            })
            .map(|(_, value)| value)
            .sum()
    }

    /// `sqlhttpd_replica_reads_total` served by `served_by`, over every reason.
    fn reads_served_by(&self, served_by: &str) -> f64 {
        self.sum("sqlhttpd_replica_reads_total", &[("served_by", served_by)])
    }

    /// The `sqlhttpd_replica_healthy` values, one a configured replica.
    fn healthy(&self) -> Vec<f64> {
        self.series("sqlhttpd_replica_healthy")
            .into_iter()
            .map(|(_, value)| value)
            .collect()
    }
}

/// One sample line of the text exposition, `name{key="value",...} value`; `None` for
/// comments and anything else.
fn parse_sample(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let close = inner.find('}')?;
        for pair in inner[..close].split(',').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=')?;
            labels.insert(key.to_owned(), value.trim_matches('"').to_owned());
        }
        rest = &inner[close + 1..];
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}

/// Waits until `check` holds, asking every 50 ms; fails with `what` past [`DEADLINE`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < DEADLINE,
            "not within {DEADLINE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the server at `url` reports `count` replicas, every one healthy.
async fn all_healthy(url: &str, count: usize) {
    eventually("every replica reported healthy", || async {
        let healthy = Metrics::of(url).await.healthy();
        healthy.len() == count && healthy.iter().all(|&h| h == 1.0)
    })
    .await;
}

/// A table `kv` with one row (`k = 1`, `v = value`), replayed by every replica, on the server
/// at `url` whose replicas are all reported healthy.
async fn prepared(url: &str, database: &ReplicaDatabase, replicas: usize, value: &str) {
    write(
        url,
        "CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)",
        json!([]),
        &[],
    )
    .await
    .ok();
    write(url, "INSERT INTO kv VALUES (1, $1)", json!([value]), &[])
        .await
        .ok();
    database.caught_up().await;
    all_healthy(url, replicas).await;
}

/// The port of a `postgres://` URL.
fn port(url: &str) -> u16 {
    let (_, after) = url.rsplit_once(':').unwrap();
    after.split('/').next().unwrap().parse().unwrap()
}

/// The superuser's URL of the `postgres` database on the server of the database URL `url`.
fn cluster_url(url: &str) -> String {
    format!("{}/postgres", url.rsplit_once('/').unwrap().0)
}

/// A replica whose WAL replay is paused; resumed by [`Paused::resume`] or on drop.
struct Paused {
    replica: String,
    resumed: bool,
}

impl Paused {
    /// Pauses replay on the replica whose database URL is `replica`, as the superuser: it keeps
    /// receiving the primary's WAL and serving reads, of what it replayed until now.
    async fn pause(replica: &str) -> Paused {
        let replica = cluster_url(replica);
        owner(&replica)
            .await
            .execute("SELECT pg_wal_replay_pause()", &[])
            .await
            .unwrap();
        Paused {
            replica,
            resumed: false,
        }
    }

    async fn resume(mut self) {
        resume(&self.replica).await;
        self.resumed = true;
    }
}

async fn resume(replica: &str) {
    owner(replica)
        .await
        .execute("SELECT pg_wal_replay_resume()", &[])
        .await
        .unwrap();
}

impl Drop for Paused {
    fn drop(&mut self) {
        if self.resumed {
            return;
        }
        // A test that failed while the replica was paused: resume it for the tests after it.
        let replica = self.replica.clone();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(resume(&replica));
        })
        .join();
    }
}

/// The directory of PostgreSQL's programs, as `scripts/start-postgres` finds it.
fn pg_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("PG_BIN") {
        return bin.into();
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_default()
}

/// Runs `pg_ctl ARGS` as the owner of the clusters `scripts/start-postgres` made (`postgres`
/// when we are root, as there), and whether it succeeded (what it said goes to stderr when it
/// did not).
fn pg_ctl(args: &[&str]) -> bool {
    let pg_ctl = pg_bin().join("pg_ctl");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    let mut command = if root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(&pg_ctl);
        command
    } else {
        Command::new(&pg_ctl)
    };
    match command.args(args).output() {
        Ok(output) if output.status.success() => true,
        Ok(output) => {
            eprintln!(
                "pg_ctl {args:?} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            false
        }
        Err(e) => {
            eprintln!("cannot run {}: {e}", pg_ctl.display());
            false
        }
    }
}

/// A replica stopped as a crash would stop it; started again by [`Stopped::start`] or on drop.
struct Stopped {
    /// Its directory, as `scripts/start-postgres` names it.
    dir: PathBuf,
    started: bool,
}

impl Stopped {
    /// Stops the replica whose database URL is `replica` with `pg_ctl stop -m immediate`;
    /// `None` (with a message) when its directory is not on this machine.
    fn stop(replica: &str) -> Option<Stopped> {
        let dir = std::env::temp_dir().join(format!("sqlhttp-postgres-{}", port(replica)));
        if !dir.join("data").is_dir() {
            eprintln!(
                "skipping: the replica {replica} is not in {} on this machine",
                dir.display()
            );
            return None;
        }
        let data = dir.join("data");
        assert!(
            pg_ctl(&["-D", data.to_str()?, "-m", "immediate", "-w", "stop"]),
            "pg_ctl stop failed"
        );
        Some(Stopped {
            dir,
            started: false,
        })
    }

    /// Starts it again with the options it last ran with (`pg_ctl restart` reads them from
    /// the data directory's `postmaster.opts`), and waits until it takes connections.
    fn start(&mut self) {
        let data = self.dir.join("data");
        let log = self.dir.join("postgres.log");
        self.started = true;
        assert!(
            pg_ctl(&[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "30",
                "restart",
            ]),
            "pg_ctl restart failed"
        );
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.started {
            // A test that failed while the replica was down: start it for the tests after it.
            self.start();
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn reads_are_served_by_a_replica_and_writes_by_the_primary() {
        let cluster =
            replica_cluster_or_return!("reads_are_served_by_a_replica_and_writes_by_the_primary");
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = every_replica(&database, "one").await;
        let url = server.url();

        let written = set_value(url, "two").await;
        assert_ne!(written.served_by(), Some("replica"), "{written:?}");
        assert_eq!(written.body["stats"]["served_by"], "primary", "{written:?}");
        written.bookmark();
        database.caught_up().await;

        let before = Metrics::of(url).await;
        // Verified reads: the flag, and a read-only credential's statements.
        for _ in 0..4 {
            let answer = read_value(url, &[]).await;
            assert_eq!(answer.served_by(), Some("replica"), "{answer:?}");
            // The body's stats say who served it too (issue 40).
            assert_eq!(answer.body["stats"]["served_by"], "replica", "{answer:?}");
            assert_eq!(answer.cell(), "two");
            answer.bookmark();
        }
        let by_reader = post(
            url,
            "/api/v1/sql",
            &READER,
            &json!({"sql": "SELECT v FROM kv WHERE k = 1"}),
        )
        .await
        .ok();
        assert_eq!(by_reader.served_by(), Some("replica"), "{by_reader:?}");
        assert_eq!(by_reader.cell(), "two");
        // A statement the full-access credential sends without the flag is not a verified read.
        let unflagged = write(url, "SELECT v FROM kv WHERE k = 1", json!([]), &[])
            .await
            .ok();
        assert_ne!(unflagged.served_by(), Some("replica"), "{unflagged:?}");
        assert_eq!(unflagged.cell(), "two");

        let after = Metrics::of(url).await;
        assert_eq!(
            after.reads_served_by("replica") - before.reads_served_by("replica"),
            5.0,
            "five reads served by a replica"
        );
        assert_eq!(
            after.sum(
                "sqlhttpd_replica_reads_total",
                &[("served_by", "replica"), ("reason", "routed")]
            ) - before.sum(
                "sqlhttpd_replica_reads_total",
                &[("served_by", "replica"), ("reason", "routed")]
            ),
            5.0
        );
        assert_eq!(after.healthy(), vec![1.0; database.replicas.len()]);
        assert_eq!(
            after.series("sqlhttpd_replica_lag_seconds").len(),
            database.replicas.len()
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_read_with_the_bookmark_of_a_write_sees_that_write() {
        let cluster = replica_cluster_or_return!("a_read_with_the_bookmark_of_a_write_sees_that_write");
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = every_replica(&database, "0").await;
        let url = server.url();

        let mut by_replica = 0;
        let mut bookmark = String::new();
        for i in 1..=200 {
            let value = i.to_string();
            bookmark = set_value(url, &value).await.bookmark();
            let answer = read_value(url, &[("sqlhttp-bookmark", &bookmark)]).await;
            assert_eq!(answer.cell(), value.as_str(), "read {i}: {answer:?}");
            assert!(answer.bookmark() >= bookmark, "read {i}: {answer:?}");
            if answer.served_by() == Some("replica") {
                by_replica += 1;
            }
        }
        eprintln!("{by_replica} of 200 reads with a fresh bookmark were served by a replica");
        // Once every replica has replayed the last write, its bookmark is no reason to leave them.
        database.caught_up().await;
        for _ in 0..database.replicas.len() {
            let answer = read_value(url, &[("sqlhttp-bookmark", &bookmark)]).await;
            assert_eq!(answer.served_by(), Some("replica"), "{answer:?}");
            assert_eq!(answer.cell(), "200");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_paused_replica_hands_a_fresh_bookmark_to_the_primary_and_serves_stale_reads_without_one()
    {
        let test =
            "a_paused_replica_hands_a_fresh_bookmark_to_the_primary_and_serves_stale_reads_without_one";
        let cluster = replica_cluster_or_return!(test);
        let _exclusive = REPLICAS.write().await;
        let database = cluster.database().await;
        let server = one_replica_never_too_far(&database).await;
        let url = server.url();
        prepared(url, &database, 1, "old").await;
        let old = set_value(url, "old").await.bookmark();
        database.caught_up().await;

        let paused = Paused::pause(&database.replicas[0]).await;
        let new = set_value(url, "new").await.bookmark();
        assert!(new > old, "{new} after {old}");
        let before = Metrics::of(url).await;

        let fresh = read_value(url, &[("sqlhttp-bookmark", &new)]).await;
        assert_eq!(fresh.served_by(), Some("primary"), "{fresh:?}");
        assert_eq!(fresh.cell(), "new");
        assert!(fresh.bookmark() >= new, "{fresh:?}");
        let after = Metrics::of(url).await;
        let behind = [("served_by", "primary"), ("reason", "behind")];
        assert_eq!(
            after.sum("sqlhttpd_replica_reads_total", &behind)
                - before.sum("sqlhttpd_replica_reads_total", &behind),
            1.0
        );

        // Without a bookmark, or with one the replica has replayed, the replica serves what it has.
        let stale = read_value(url, &[]).await;
        assert_eq!(stale.served_by(), Some("replica"), "{stale:?}");
        assert_eq!(stale.cell(), "old");
        let with_old = read_value(url, &[("sqlhttp-bookmark", &old)]).await;
        assert_eq!(with_old.served_by(), Some("replica"), "{with_old:?}");
        assert_eq!(with_old.cell(), "old");
        assert!(with_old.bookmark() >= old, "{with_old:?}");

        paused.resume().await;
        database.caught_up().await;
        let caught_up = read_value(url, &[("sqlhttp-bookmark", &new)]).await;
        assert_eq!(caught_up.served_by(), Some("replica"), "{caught_up:?}");
        assert_eq!(caught_up.cell(), "new");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn bookmarks_are_ordered_and_never_go_back() {
        let cluster = replica_cluster_or_return!("bookmarks_are_ordered_and_never_go_back");
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = every_replica(&database, "0").await;
        let url = server.url();

        // A client that keeps the greatest bookmark it saw and sends it on everything.
        let mut greatest = set_value(url, "0").await.bookmark();
        for i in 0..40 {
            let sent = greatest.clone();
            let header = [("sqlhttp-bookmark", sent.as_str())];
            let answer = match i % 5 {
                0 => {
                    write(
                        url,
                        "UPDATE kv SET v = $1 WHERE k = 1",
                        json!([i.to_string()]),
                        &header,
                    )
                    .await
                }
                1 => read(url, "SELECT v FROM kv WHERE k = 1", json!([]), &header).await,
                2 => {
                    let body = json!({"read_only": true, "statements": [
                        {"sql": "SELECT v FROM kv WHERE k = 1"},
                        {"sql": "SELECT count(*) FROM kv"},
                    ]});
                    let mut headers = WRITER.to_vec();
                    headers.extend_from_slice(&header);
                    post(url, "/api/v1/batch", &headers, &body).await
                }
                3 => {
                    let body = json!({"statements": [
                        {"sql": "INSERT INTO kv VALUES ($1, 'batch')", "params": [1000 + i]},
                    ]});
                    let mut headers = WRITER.to_vec();
                    headers.extend_from_slice(&header);
                    post(url, "/api/v1/batch", &headers, &body).await
                }
                _ => committed_transaction(url, 2000 + i, &header).await,
            };
            let answer = answer.ok();
            let got = answer.bookmark();
            assert!(
                got >= sent,
                "step {i}: {got} before the {sent} it was sent: {answer:?}"
            );
            greatest = greatest.max(got);
        }
        // Upper case is accepted.
        let upper = read_value(url, &[("sqlhttp-bookmark", &greatest.to_uppercase())]).await;
        assert!(upper.bookmark() >= greatest, "{upper:?}");
    }
}

/// Opens an interactive transaction, inserts row `k` in it and commits, sending `headers` on
/// every step: the commit's answer.
async fn committed_transaction(url: &str, k: i64, headers: &[(&str, &str)]) -> Answer {
    let mut all = WRITER.to_vec();
    all.extend_from_slice(headers);
    let open = post(url, "/api/v1/transaction/open", &all, &json!({}))
        .await
        .ok();
    let transaction = open.body["transaction"].as_str().unwrap().to_owned();
    post(
        url,
        "/api/v1/transaction/statement",
        &all,
        &json!({"transaction": transaction, "seq": 1,
                "sql": "INSERT INTO kv VALUES ($1, 'tx')", "params": [k]}),
    )
    .await
    .ok();
    post(
        url,
        "/api/v1/transaction/commit",
        &all,
        &json!({"transaction": transaction}),
    )
    .await
}

needs_postgres! {
    #[tokio::test]
    async fn a_stopped_replica_hands_its_reads_to_the_primary_until_it_is_back() {
        let test = "a_stopped_replica_hands_its_reads_to_the_primary_until_it_is_back";
        let cluster = replica_cluster_or_return!(test);
        let _exclusive = REPLICAS.write().await;
        let database = cluster.database().await;
        let server = sqlhttpd_on(&database, &[0], &[]).await;
        let url = server.url();
        prepared(url, &database, 1, "kept").await;
        let served = read_value(url, &[]).await;
        assert_eq!(served.served_by(), Some("replica"), "{served:?}");

        let Some(mut stopped) = Stopped::stop(&database.replicas[0]) else {
            return;
        };
        let before = Metrics::of(url).await;
        for i in 0..10 {
            let answer = read_value(url, &[]).await;
            assert_eq!(answer.served_by(), Some("primary"), "read {i}: {answer:?}");
            assert_eq!(answer.cell(), "kept");
        }
        let ready = http_client()
            .get(format!("{url}/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            ready.status().as_u16(),
            200,
            "/readyz depends on the primary only"
        );
        eventually("the stopped replica reported unhealthy", || async {
            Metrics::of(url).await.healthy() == vec![0.0]
        })
        .await;
        let answer = read_value(url, &[]).await;
        assert_eq!(answer.served_by(), Some("primary"), "{answer:?}");
        let after = Metrics::of(url).await;
        assert_eq!(
            after.reads_served_by("primary") - before.reads_served_by("primary"),
            11.0,
            "every read counted as served by the primary"
        );
        assert_eq!(
            after.reads_served_by("replica"),
            before.reads_served_by("replica")
        );

        stopped.start();
        all_healthy(url, 1).await;
        eventually("a read served by the restarted replica", || async {
            let answer = read_value(url, &[]).await;
            assert_eq!(answer.cell(), "kept");
            answer.served_by() == Some("replica")
        })
        .await;
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_replica_further_behind_than_the_max_lag_is_skipped() {
        let cluster =
            replica_cluster_or_return!("a_replica_further_behind_than_the_max_lag_is_skipped");
        let _exclusive = REPLICAS.write().await;
        let database = cluster.database().await;
        let server = sqlhttpd_on(&database, &[0], &["--max-replica-lag", "1s"]).await;
        let url = server.url();
        prepared(url, &database, 1, "0").await;
        let served = read_value(url, &[]).await;
        assert_eq!(served.served_by(), Some("replica"), "{served:?}");

        let paused = Paused::pause(&database.replicas[0]).await;
        // Keep writing, so the primary moves on while the replica stays where it paused.
        let mut last = 0;
        eventually("the paused replica's lag past --max-replica-lag", || {
            last += 1;
            let value = last.to_string();
            async move {
                set_value(url, &value).await;
                let lags: Vec<f64> = Metrics::of(url)
                    .await
                    .series("sqlhttpd_replica_lag_seconds")
                    .into_iter()
                    .map(|(_, lag)| lag)
                    .collect();
                lags.len() == 1 && lags[0] > 1.0
            }
        })
        .await;
        let before = Metrics::of(url).await;
        let skipped = read_value(url, &[]).await;
        assert_eq!(skipped.served_by(), Some("primary"), "{skipped:?}");
        assert_eq!(skipped.cell(), last.to_string().as_str());
        let after = Metrics::of(url).await;
        assert_eq!(
            after.reads_served_by("primary") - before.reads_served_by("primary"),
            1.0
        );

        paused.resume().await;
        eventually("a read served by the replica once it caught up", || async {
            let answer = read_value(url, &[]).await;
            answer.served_by() == Some("replica") && answer.cell() == last.to_string().as_str()
        })
        .await;
        let lag = Metrics::of(url)
            .await
            .series("sqlhttpd_replica_lag_seconds")[0]
            .1;
        assert!(lag <= 1.0, "lag {lag} s once caught up");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn consistency_primary_is_served_by_the_primary_and_malformed_headers_are_refused() {
        let test = "consistency_primary_is_served_by_the_primary_and_malformed_headers_are_refused";
        let cluster = replica_cluster_or_return!(test);
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = every_replica(&database, "v").await;
        let url = server.url();

        let asked = [("served_by", "primary"), ("reason", "asked")];
        let before = Metrics::of(url).await;
        let primary = read_value(url, &[("sqlhttp-consistency", "primary")]).await;
        assert_eq!(primary.served_by(), Some("primary"), "{primary:?}");
        assert_eq!(primary.cell(), "v");
        primary.bookmark();
        let after = Metrics::of(url).await;
        assert_eq!(
            after.sum("sqlhttpd_replica_reads_total", &asked)
                - before.sum("sqlhttpd_replica_reads_total", &asked),
            1.0
        );
        let session = read_value(url, &[("sqlhttp-consistency", "session")]).await;
        assert_eq!(session.served_by(), Some("replica"), "{session:?}");

        for bookmark in [
            "",
            "0",
            "000000000000000",
            "00000000000000000",
            "000000000000000g",
            "0x00000000000000",
            "-000000000000001",
            "0/3000060",
        ] {
            let header = [("sqlhttp-bookmark", bookmark)];
            let refused = read(url, "SELECT 1", json!([]), &header).await;
            assert_eq!(refused.status, 400, "bookmark {bookmark:?}: {refused:?}");
            assert_eq!(refused.body["error"]["code"], "BAD_REQUEST", "{refused:?}");
            let refused = write(url, "UPDATE kv SET v = 'w'", json!([]), &header).await;
            assert_eq!(refused.status, 400, "bookmark {bookmark:?}: {refused:?}");
        }
        for consistency in ["", "eventual", "any", "strong"] {
            let header = [("sqlhttp-consistency", consistency)];
            let refused = read(url, "SELECT 1", json!([]), &header).await;
            assert_eq!(
                refused.status, 400,
                "consistency {consistency:?}: {refused:?}"
            );
            assert_eq!(refused.body["error"]["code"], "BAD_REQUEST", "{refused:?}");
        }
        // Nothing refused was written.
        assert_eq!(
            read_value(url, &[("sqlhttp-consistency", "primary")])
                .await
                .cell(),
            "v"
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn read_only_batches_go_to_a_replica_and_write_batches_to_the_primary() {
        let test = "read_only_batches_go_to_a_replica_and_write_batches_to_the_primary";
        let cluster = replica_cluster_or_return!(test);
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = every_replica(&database, "b").await;
        let url = server.url();

        let reads = json!({"read_only": true, "statements": [
            {"sql": "SELECT v FROM kv WHERE k = 1"},
            {"sql": "SELECT count(*) FROM kv"},
        ]});
        let batch = post(url, "/api/v1/batch", &WRITER, &reads).await.ok();
        assert_eq!(batch.served_by(), Some("replica"), "{batch:?}");
        assert_eq!(batch.body["results"][0]["rows"][0][0], "b");
        assert_eq!(batch.body["results"][1]["rows"][0][0], 1);
        batch.bookmark();

        let writes = json!({"statements": [
            {"sql": "INSERT INTO kv VALUES (2, 'c')"},
            {"sql": "SELECT count(*) FROM kv"},
        ]});
        let batch = post(url, "/api/v1/batch", &WRITER, &writes).await.ok();
        assert_ne!(batch.served_by(), Some("replica"), "{batch:?}");
        assert_eq!(batch.body["results"][1]["rows"][0][0], 2);
        batch.bookmark();
    }
}

needs_postgres! {
    #[tokio::test]
    async fn keyed_writes_go_to_the_primary_and_a_keyed_read_stays_a_read() {
        let test = "keyed_writes_go_to_the_primary_and_a_keyed_read_stays_a_read";
        let cluster = replica_cluster_or_return!(test);
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = every_replica(&database, "k").await;
        let url = server.url();

        let key = [("idempotency-key", "a-keyed-write")];
        let written = write(
            url,
            "UPDATE kv SET v = 'keyed' WHERE k = 1",
            json!([]),
            &key,
        )
        .await
        .ok();
        assert_eq!(written.served_by(), Some("primary"), "{written:?}");
        let bookmark = written.bookmark();
        // Sent again, it is replayed from the primary's store: the same answer, the same bookmark.
        let replayed = write(
            url,
            "UPDATE kv SET v = 'keyed' WHERE k = 1",
            json!([]),
            &key,
        )
        .await
        .ok();
        assert_eq!(
            replayed.header("idempotent-replayed"),
            Some("true"),
            "{replayed:?}"
        );
        assert_ne!(replayed.served_by(), Some("replica"), "{replayed:?}");

        // A verified read ignores its key (ADR 0039): a read like any other, which a replica may
        // serve, and which sees the write its bookmark names.
        database.caught_up().await;
        let keyed_read = read_value(
            url,
            &[
                ("idempotency-key", "a-keyed-read"),
                ("sqlhttp-bookmark", &bookmark),
            ],
        )
        .await;
        assert_eq!(keyed_read.served_by(), Some("replica"), "{keyed_read:?}");
        assert_eq!(keyed_read.cell(), "keyed");
        assert!(keyed_read.bookmark() >= bookmark, "{keyed_read:?}");
    }
}

#[tokio::test]
async fn sqlite_accepts_a_bookmark_and_answers_none() {
    let mut command = sqlhttpd();
    command.stderr(Stdio::inherit());
    let server = ServerProcess::spawn_command(command).await.unwrap();
    let url = server.url();

    let created = post_sql(url, json!({"sql": "CREATE TABLE t (x INTEGER)"}), &[])
        .await
        .ok();
    assert_eq!(created.header("sqlhttp-bookmark"), None, "{created:?}");
    let bookmark = [("sqlhttp-bookmark", "ffffffffffffffff")];
    let inserted = post_sql(url, json!({"sql": "INSERT INTO t VALUES (7)"}), &bookmark)
        .await
        .ok();
    assert_eq!(inserted.header("sqlhttp-bookmark"), None, "{inserted:?}");
    for headers in [
        &bookmark[..],
        &[("sqlhttp-bookmark", "FFFFFFFFFFFFFFFF")],
        &[
            ("sqlhttp-bookmark", "0000000000000000"),
            ("sqlhttp-consistency", "primary"),
        ],
    ] {
        let answer = post_sql(
            url,
            json!({"sql": "SELECT x FROM t", "read_only": true}),
            headers,
        )
        .await
        .ok();
        assert_eq!(answer.cell(), 7, "{answer:?}");
        assert_eq!(answer.header("sqlhttp-bookmark"), None, "{answer:?}");
        assert_eq!(answer.served_by(), None, "{answer:?}");
    }
    let batch = post(
        url,
        "/api/v1/batch",
        &bookmark,
        &json!({"read_only": true, "statements": [{"sql": "SELECT x FROM t"}]}),
    )
    .await
    .ok();
    assert_eq!(batch.header("sqlhttp-bookmark"), None, "{batch:?}");

    let malformed = post_sql(
        url,
        json!({"sql": "SELECT x FROM t", "read_only": true}),
        &[("sqlhttp-bookmark", "not a bookmark")],
    )
    .await;
    assert_eq!(malformed.status, 400, "{malformed:?}");
    assert_eq!(malformed.body["error"]["code"], "BAD_REQUEST");
}

/// POSTs `body` to `/api/v1/sql` on the server at `url` with `headers`.
async fn post_sql(url: &str, body: Value, headers: &[(&str, &str)]) -> Answer {
    post(url, "/api/v1/sql", headers, &body).await
}

needs_postgres! {
    #[tokio::test]
    async fn a_read_only_repeatable_read_transaction_is_served_by_a_replica_as_far_as_its_bookmark() {
        let test =
            "a_read_only_repeatable_read_transaction_is_served_by_a_replica_as_far_as_its_bookmark";
        let cluster = replica_cluster_or_return!(test);
        let _exclusive = REPLICAS.write().await;
        let database = cluster.database().await;
        let server = one_replica_never_too_far(&database).await;
        let url = server.url();
        prepared(url, &database, 1, "old").await;
        let written = set_value(url, "new").await.bookmark();
        database.caught_up().await;

        let open = |headers: Vec<(&'static str, String)>, isolation: &'static str| {
            let url = url.to_owned();
            async move {
                let mut all: Vec<(&str, &str)> = WRITER.to_vec();
                all.extend(headers.iter().map(|(name, value)| (*name, value.as_str())));
                post(
                    &url,
                    "/api/v1/transaction/open",
                    &all,
                    &json!({"read_only": true, "isolation": isolation}),
                )
                .await
                .ok()
            }
        };
        let statement = |token: String| {
            let url = url.to_owned();
            async move {
                post(
                    &url,
                    "/api/v1/transaction/statement",
                    &WRITER,
                    &json!({"transaction": token, "seq": 1, "sql": "SELECT v FROM kv WHERE k = 1"}),
                )
                .await
                .ok()
            }
        };
        let token = |answer: &Answer| answer.body["transaction"].as_str().unwrap().to_owned();

        // Its open takes the snapshot on the replica, after the replay check, and names its
        // position: at or past the write its bookmark named, which it sees.
        let opened = open(
            vec![("sqlhttp-bookmark", written.clone())],
            "repeatable_read",
        )
        .await;
        assert_eq!(opened.served_by(), Some("replica"), "{opened:?}");
        assert!(opened.bookmark() >= written, "{opened:?}");
        assert_eq!(statement(token(&opened)).await.cell(), "new");

        // A serializable one (the default) stays on the primary: a hot standby refuses the level.
        let serializable = open(Vec::new(), "serializable").await;
        assert_eq!(
            serializable.served_by(),
            Some("primary"),
            "{serializable:?}"
        );
        assert_eq!(statement(token(&serializable)).await.cell(), "new");

        // A replica that has not replayed the bookmark hands the transaction to the primary.
        let paused = Paused::pause(&database.replicas[0]).await;
        let newer = set_value(url, "newer").await.bookmark();
        let behind = open(vec![("sqlhttp-bookmark", newer.clone())], "repeatable_read").await;
        assert_eq!(behind.served_by(), Some("primary"), "{behind:?}");
        assert_eq!(statement(token(&behind)).await.cell(), "newer");
        paused.resume().await;
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_read_a_replica_cannot_run_is_served_by_the_primary() {
        let test = "a_read_a_replica_cannot_run_is_served_by_the_primary";
        let cluster = replica_cluster_or_return!(test);
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = sqlhttpd_on(&database, &[0], &[]).await;
        let url = server.url();
        prepared(url, &database, 1, "v").await;

        // A hot standby refuses what needs a primary ("recovery is in progress"): the primary
        // answers instead of the replica's refusal.
        let position = read(url, "SELECT pg_current_wal_lsn()::text", json!([]), &[])
            .await
            .ok();
        assert_eq!(position.served_by(), Some("primary"), "{position:?}");
        // A write sent as a read is refused by the primary as it always was.
        let write = read(url, "INSERT INTO kv VALUES (9, 'w')", json!([]), &[]).await;
        assert_eq!(write.status, 403, "{write:?}");
        assert_eq!(write.body["error"]["code"], "READ_ONLY");
        // Whatever a replica can run, it still serves.
        assert_eq!(read_value(url, &[]).await.served_by(), Some("replica"));
    }
}

needs_postgres! {
    /// A read a hot standby refuses for being one is served by the primary, whatever the code it
    /// refuses it with: an `UNLOGGED` table (`0A000`, "during recovery"), read with the flag, by a
    /// read credential, and in a read-only batch.
    #[tokio::test]
    async fn a_read_of_what_a_standby_cannot_read_is_served_by_the_primary() {
        let cluster =
            replica_cluster_or_return!("a_read_of_what_a_standby_cannot_read_is_served_by_the_primary");
        let _shared = REPLICAS.read().await;
        let database = cluster.database().await;
        let server = every_replica(&database, "one").await;
        let url = server.url();
        write(
            url,
            "CREATE UNLOGGED TABLE scratch (x INTEGER)",
            json!([]),
            &[],
        )
        .await
        .ok();
        write(url, "INSERT INTO scratch VALUES (7)", json!([]), &[])
            .await
            .ok();
        database.caught_up().await;
        let sql = "SELECT x FROM scratch";
        for _ in 0..3 {
            let flagged = read(url, sql, json!([]), &[]).await.ok();
            assert_eq!(flagged.cell(), 7, "{flagged:?}");
            assert_ne!(flagged.served_by(), Some("replica"), "{flagged:?}");
        }
        let by_reader = post(url, "/api/v1/sql", &READER, &json!({"sql": sql}))
            .await
            .ok();
        assert_eq!(by_reader.cell(), 7, "{by_reader:?}");
        let batch = post(
            url,
            "/api/v1/batch",
            &READER,
            &json!({"statements": [{"sql": sql}], "read_only": true}),
        )
        .await;
        assert_eq!(batch.status, 200, "{batch:?}");
    }
}
