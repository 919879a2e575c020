//! Read replicas under a hostile or unlucky client (ADR 0039): a replica read's bookmark covers
//! every commit the replica may be showing, and a read-only batch on a replica that stops
//! answering is served by the primary instead of waiting for it. Each test runs on a cluster of
//! its own with one streaming replica (`scripts/start-postgres --replica 1`), stopped when the
//! test process exits.

use std::process::Command;
use std::time::Duration;

use axum::Router;
use serde_json::{Value, json};
use sqlhttp_server::{AppState, Config, Database, ReadReplicas, app};

use crate::common::{Reply, batch_with, post_with, send};
use crate::engines::{client_role, config, database_on, needs_postgres, owner, start_postgres};

/// A cluster of the test's own, the primary's and the replica's URLs (their `postgres`
/// database): the tests freeze and pause their replica. `None` (with a message, and a failure
/// under `SQLHTTPD_TEST_REQUIRE_POSTGRES`) when there is no PostgreSQL here.
fn cluster() -> Option<(String, String)> {
    let cluster = start_replicated();
    if cluster.is_none() {
        assert!(
            std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
            "cannot start a cluster with a replica, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
        );
        eprintln!("skipping: no PostgreSQL for scripts/start-postgres --replica 1");
    }
    cluster
}

fn start_replicated() -> Option<(String, String)> {
    let urls = start_postgres(&["--replica", "1"], "trust", &[])?;
    match urls.as_slice() {
        [primary, replica] => Some((primary.clone(), replica.clone())),
        _ => None,
    }
}

/// A test's database on the primary, its name on the replica, and an app that reads there.
struct Replicated {
    router: Router,
    /// The test database on the replica, as the cluster's superuser.
    replica: String,
}

/// A fresh database for one test, and an app with the replica as `--read-replica` (lagging as
/// far as it likes: these tests pause it), once the replica serves its reads.
async fn replicated() -> Option<Replicated> {
    replicated_with(|_| {}).await
}

/// [`replicated`], its configuration changed by `tweak` first.
async fn replicated_with(tweak: impl FnOnce(&mut Config)) -> Option<Replicated> {
    let (primary, replica) = cluster()?;
    let url = database_on(&primary).await;
    let (_, name) = url.rsplit_once('/').unwrap();
    let (replica_base, _) = replica.rsplit_once('/').unwrap();
    let replica = format!("{replica_base}/{name}");
    let mut config = config(&url);
    let Ok(Database::Postgres(replica_url)) = replica.parse() else {
        panic!("a PostgreSQL URL: {replica}");
    };
    config.read_replicas = ReadReplicas {
        urls: vec![replica_url.with_client_role(&client_role(&url)).unwrap()],
        max_lag: Duration::from_secs(3600),
        ..ReadReplicas::default()
    };
    tweak(&mut config);
    let router = app(AppState::new(&config).unwrap());
    let replicated = Replicated { router, replica };
    replicated
        .read_until("SELECT 1", |reply| {
            reply.header("sqlhttp-served-by") == Some("replica")
        })
        .await;
    Some(replicated)
}

impl Replicated {
    async fn write(&self, sql: &str) -> Reply {
        let reply = post_with(&self.router, &[], &json!({"sql": sql})).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        reply
    }

    async fn read(&self, sql: &str) -> Reply {
        post_with(&self.router, &[], &json!({"sql": sql, "read_only": true})).await
    }

    /// Reads `sql` until an answer is `fit` (the replica catching up, its watcher seeing it).
    async fn read_until(&self, sql: &str, fit: impl Fn(&Reply) -> bool) -> Reply {
        for _ in 0..400 {
            let reply = self.read(sql).await;
            if fit(&reply) {
                return reply;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no fit answer to {sql}");
    }

    /// Reads `served_by` served for `reason`, from `/metrics`.
    async fn reads_served(&self, served_by: &str, reason: &str) -> f64 {
        let reply = send(&self.router, "GET", "/metrics", &[], "").await;
        let text = String::from_utf8(reply.body).unwrap();
        let served_by = format!(r#"served_by="{served_by}""#);
        let reason = format!(r#"reason="{reason}""#);
        text.lines()
            .filter(|line| line.starts_with("sqlhttpd_replica_reads_total{"))
            .filter(|line| line.contains(&served_by) && line.contains(&reason))
            .map(|line| line.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum()
    }

    /// Asks the replica, as the superuser, for one text value.
    async fn ask_replica(&self, sql: &str) -> String {
        let client = owner(&self.replica).await;
        client.query_one(sql, &[]).await.unwrap().get(0)
    }

    /// The replica's postmaster and its children: what a frozen machine stops.
    async fn replica_processes(&self) -> Vec<String> {
        let dir = self.ask_replica("SHOW data_directory").await;
        let pid = std::fs::read_to_string(format!("{dir}/postmaster.pid")).unwrap();
        let pid = pid.lines().next().unwrap().trim().to_owned();
        let children = Command::new("pgrep").args(["-P", &pid]).output().unwrap();
        let mut pids = vec![pid];
        pids.extend(
            String::from_utf8(children.stdout)
                .unwrap()
                .split_whitespace()
                .map(str::to_owned),
        );
        pids
    }
}

fn bookmark(reply: &Reply) -> u64 {
    u64::from_str_radix(reply.header("sqlhttp-bookmark").unwrap(), 16).unwrap()
}

fn lsn(text: &str) -> u64 {
    let (high, low) = text.split_once('/').unwrap();
    (u64::from_str_radix(high, 16).unwrap() << 32) | u64::from_str_radix(low, 16).unwrap()
}

needs_postgres! {
    /// A replica shows a commit to new snapshots while it still applies the commit's record,
    /// before its replay position moves past it; a read's bookmark taken from the replay position
    /// alone could then be short of a commit the read saw, and another replica that replayed only
    /// that far would pass for consistent with it. The bookmark covers what the replica received
    /// (a record being applied was received whole), seen here with replay paused: the replica has
    /// received a write it does not show yet, and the read's bookmark is at or past it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_reads_bookmark_covers_what_the_replica_received() {
        let Some(replicated) = replicated().await else {
            return;
        };
        replicated.write("CREATE TABLE seen (id int)").await;
        replicated
            .read_until("SELECT count(*) AS n FROM seen", |reply| {
                reply.status == 200
            })
            .await;
        replicated
            .ask_replica("SELECT pg_catalog.pg_wal_replay_pause()::text")
            .await;
        let written = bookmark(&replicated.write("INSERT INTO seen VALUES (1)").await);
        for _ in 0..400 {
            let received = replicated
                .ask_replica("SELECT pg_catalog.pg_last_wal_receive_lsn()::text")
                .await;
            if lsn(&received) >= written {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let read = replicated.read("SELECT count(*) AS n FROM seen").await;
        replicated
            .ask_replica("SELECT pg_catalog.pg_wal_replay_resume()::text")
            .await;
        assert_eq!(read.status, 200);
        assert_eq!(
            read.header("sqlhttp-served-by"),
            Some("replica"),
            "{:?}",
            read.headers
        );
        assert_eq!(read.json()["rows"], json!([[0]]), "replay is paused");
        assert!(
            bookmark(&read) >= written,
            "a replica read's bookmark {:016x} is short of what the replica received ({written:016x})",
            bookmark(&read)
        );
    }
}

/// Resumes the stopped processes however the test ends.
struct Frozen(Vec<String>);

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-CONT").args(&self.0).status();
    }
}

needs_postgres! {
    /// A replica whose machine freezes (its processes stopped: it answers nothing, and its TCP
    /// connections stay open) just as a read-only batch is routed to it: the batch is abandoned
    /// when the replica's watcher finds it gone and the primary serves it, as it does a statement,
    /// instead of waiting for the replica's BEGIN until the replica wakes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_batch_on_a_frozen_replica_is_served_by_the_primary() {
        let Some(replicated) = replicated().await else {
            return;
        };
        let batch: Value = json!({"read_only": true, "statements": [{"sql": "SELECT 1 AS one"}]});
        let warm = batch_with(&replicated.router, &[], &batch).await;
        assert_eq!(warm.header("sqlhttp-served-by"), Some("replica"));
        let processes = replicated.replica_processes().await;
        let _frozen = Frozen(processes.clone());
        // The postmaster first, then its children; a child that exited since it was listed (the
        // backend that answered the listing's query) has nothing left to stop.
        for (index, pid) in processes.iter().enumerate() {
            let stopped = Command::new("kill").args(["-STOP", pid]).status().unwrap();
            let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists();
            assert!(stopped.success() || (index > 0 && gone), "cannot stop {pid}");
        }
        // Bounded only so that a regression fails instead of hanging: the replica stays frozen.
        let reply = tokio::time::timeout(
            Duration::from_secs(20),
            batch_with(&replicated.router, &[], &batch),
        )
        .await
        .expect("a read-only batch waited for a frozen replica");
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.header("sqlhttp-served-by"), Some("primary"));
        assert_eq!(reply.json()["results"][0]["rows"], json!([[1]]));
    }
}

needs_postgres! {
    /// The server's transaction slots are the server's, whichever node a transaction opens on:
    /// a read-only transaction routed to a replica while every slot is held waits for one once,
    /// for the statement timeout, and is refused, not sent to wait a second time on the
    /// primary's route.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_that_finds_no_slot_on_a_replicas_route_waits_once() {
        let Some(replicated) = replicated_with(|config| {
            // One connection a transaction may hold.
            config.limits.pool_size = 2;
            config.limits.statement_timeout = Duration::from_secs(1);
        })
        .await
        else {
            return;
        };
        let open = |body: Value| {
            let router = replicated.router.clone();
            async move {
                send(
                    &router,
                    "POST",
                    "/api/v1/transaction/open",
                    &[("content-type", "application/json")],
                    body.to_string(),
                )
                .await
            }
        };
        let held = open(json!({})).await;
        assert_eq!(held.status, 200, "{}", String::from_utf8_lossy(&held.body));
        let routed = replicated.reads_served("replica", "routed").await;
        let started = std::time::Instant::now();
        let refused = open(json!({"read_only": true, "isolation": "repeatable_read"})).await;
        let waited = started.elapsed();
        assert_eq!(
            refused.status,
            503,
            "{}",
            String::from_utf8_lossy(&refused.body)
        );
        assert!(
            waited < Duration::from_millis(1700),
            "waited {waited:?} for a slot: once on the replica's route and again on the primary's"
        );
        // It was routed to the replica, and answered there.
        assert_eq!(
            replicated.reads_served("replica", "routed").await,
            routed + 1.0
        );
        assert_eq!(replicated.reads_served("primary", "failed").await, 0.0);
    }
}

needs_postgres! {
    /// A hot standby refuses `SERIALIZABLE` ("cannot use serializable mode in a hot standby",
    /// `0A000`): a read-only batch that asks for it is served by the primary, as a
    /// `SERIALIZABLE` interactive transaction is, never refused for being routed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_serializable_read_only_batch_is_served_by_the_primary() {
        let Some(replicated) = replicated().await else {
            return;
        };
        let batch: Value = json!({
            "read_only": true,
            "isolation": "serializable",
            "statements": [{"sql": "SELECT 1 AS one"}]
        });
        let reply = batch_with(&replicated.router, &[], &batch).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.header("sqlhttp-served-by"), Some("primary"));
        assert_eq!(reply.json()["results"][0]["rows"], json!([[1]]));
    }
}
