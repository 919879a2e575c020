//! How a test gets a server on each engine: the [`Engine`] a case runs on, SQLite in memory or a
//! fresh PostgreSQL database (a [`SharedDatabase`] for several apps on one), and
//! [`on_both_engines!`], which runs one case body on both. Also
//! the PostgreSQL cluster itself, for the tests that only make sense there. No assertions about
//! the server live here.
//!
//! The cluster is `SQLHTTPD_TEST_POSTGRES_URL` when set (CI starts one), else a throwaway one
//! from `scripts/start-postgres` (never installing the package), stopped when the test process
//! exits. On a machine with neither (no URL, no PostgreSQL binaries), the crate's build script
//! sets `cfg(sqlhttpd_no_postgres)` and every test that needs PostgreSQL (written inside
//! [`needs_postgres!`], as `on_both_engines!`'s PostgreSQL half is) is reported as ignored,
//! with the reason. If a cluster cannot be started all the same, the test says so on stderr and
//! returns: set `SQLHTTPD_TEST_REQUIRE_POSTGRES=1` (as `.ci/run` does) to make that a failure.
//!
//! The read-replica tests use a [`ReplicaCluster`], a primary with streaming replicas:
//! `SQLHTTPD_TEST_POSTGRES_URL` with `SQLHTTPD_TEST_POSTGRES_REPLICA_URLS` (the replicas' URLs,
//! separated by spaces) when both are set, else one `scripts/start-postgres --replica 2` of their
//! own, started once per test process and stopped as the other is.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use sqlhttp_server::{AppState, Config, app};

use crate::common::TempDb;

/// The engine one run of an engine-neutral case uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// SQLite, in memory: every app is a database of its own.
    Sqlite,
    /// PostgreSQL: every app is a fresh database on the test cluster, logged in as its own
    /// client role.
    Postgres,
}

impl Engine {
    /// `sqlite` or `postgres`, whichever this engine's is: for the few things an engine defines
    /// itself (a column's type name, the SQL that fails or runs long there).
    pub(crate) fn pick<T>(self, sqlite: T, postgres: T) -> T {
        match self {
            Engine::Sqlite => sqlite,
            Engine::Postgres => postgres,
        }
    }

    /// A configuration for a fresh database on this engine, or `None` (with a message, and a
    /// failure under `SQLHTTPD_TEST_REQUIRE_POSTGRES`) when there is no PostgreSQL.
    pub(crate) async fn config(self) -> Option<Config> {
        match self {
            Engine::Sqlite => Some(Config::default()),
            Engine::Postgres => Some(config(&database(&current_test()).await?)),
        }
    }

    /// An app on a fresh database on this engine, with `tweak` applied to its configuration;
    /// `None` as for [`Engine::config`].
    pub(crate) async fn app(self, tweak: impl FnOnce(&mut Config)) -> Option<Router> {
        let mut config = self.config().await?;
        tweak(&mut config);
        Some(app(AppState::new(&config).unwrap()))
    }
}

/// A fresh database that several apps open, as replicas of one server do: SQLite's is a file,
/// removed when this drops.
pub(crate) struct SharedDatabase {
    config: Config,
    _file: Option<TempDb>,
}

impl SharedDatabase {
    /// One more app on this database, with `tweak` applied to its configuration.
    pub(crate) fn app(&self, tweak: impl FnOnce(&mut Config)) -> Router {
        let mut config = self.config.clone();
        tweak(&mut config);
        app(AppState::new(&config).unwrap())
    }
}

impl Engine {
    /// A [`SharedDatabase`] on this engine; `None` as for [`Engine::config`].
    pub(crate) async fn shared_database(self) -> Option<SharedDatabase> {
        match self {
            Engine::Sqlite => {
                let file = TempDb::new("shared");
                Some(SharedDatabase {
                    config: Config {
                        database: file.database(),
                        ..Config::default()
                    },
                    _file: Some(file),
                })
            }
            Engine::Postgres => Some(SharedDatabase {
                config: self.config().await?,
                _file: None,
            }),
        }
    }
}

/// The running test's name (libtest names each test's thread after it), for messages.
fn current_test() -> String {
    std::thread::current().name().unwrap_or("a test").to_owned()
}

/// The app of [`Engine::app`] (`$tweak` defaults to none), or `return` from the case when there
/// is no PostgreSQL.
macro_rules! engine_app {
    ($engine:expr) => {
        $crate::engines::engine_app!($engine, |_| {})
    };
    ($engine:expr, $tweak:expr) => {
        match $engine.app($tweak).await {
            Some(router) => router,
            None => return,
        }
    };
}
pub(crate) use engine_app;

/// Marks a test that needs PostgreSQL: wrapped in `needs_postgres! { ... }`, the test (with its
/// docs and its own `#[tokio::test]`) is reported as ignored, with the reason, where the build
/// script set `cfg(sqlhttpd_no_postgres)` (no `SQLHTTPD_TEST_POSTGRES_URL` and no PostgreSQL
/// binaries on this machine). The reason is written here and nowhere else.
macro_rules! needs_postgres {
    ($test:item) => {
        #[cfg_attr(
            sqlhttpd_no_postgres,
            ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL, or install the postgresql package"
        )]
        $test
    };
}
pub(crate) use needs_postgres;

/// Runs each named case, an `async fn case(engine: Engine)` in the same module, once per
/// engine: as the tests `case::sqlite` and `case::postgres`, the latter gated like every other
/// PostgreSQL test (ignored with the reason when this machine has no PostgreSQL). A leading
/// `#[tokio::test(...)]` gives the runtime both tests run on (the default is `#[tokio::test]`).
macro_rules! on_both_engines {
    (#[$test:meta] $($case:ident),+ $(,)?) => {
        $(
            mod $case {
                #[$test]
                async fn sqlite() {
                    super::$case($crate::engines::Engine::Sqlite).await;
                }

                $crate::engines::needs_postgres! {
                    #[$test]
                    async fn postgres() {
                        super::$case($crate::engines::Engine::Postgres).await;
                    }
                }
            }
        )+
    };
    ($($case:ident),+ $(,)?) => {
        $crate::engines::on_both_engines!(#[tokio::test] $($case),+);
    };
}
pub(crate) use on_both_engines;

/// The cluster's URL (its `postgres` database), started once per test process.
fn cluster() -> Option<&'static str> {
    static CLUSTER: OnceLock<Option<String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            if let Ok(url) = std::env::var("SQLHTTPD_TEST_POSTGRES_URL") {
                return Some(url);
            }
            start_cluster("trust")
        })
        .as_deref()
}

/// Starts a throwaway cluster with `scripts/start-postgres` (`auth` for roles other than
/// `postgres`), stopped when this process exits; `None` when there is no PostgreSQL here.
pub(crate) fn start_cluster(auth: &str) -> Option<String> {
    start_cluster_with(auth, &[])
}

/// [`start_cluster`], with more of `scripts/start-postgres`'s variables (`START_POSTGRES_SSL`).
pub(crate) fn start_cluster_with(auth: &str, env: &[(&str, &str)]) -> Option<String> {
    start_postgres(&[], auth, env)?.into_iter().next()
}

/// Runs `scripts/start-postgres` with `args`, and arranges for every cluster it started to be
/// stopped when this process exits: the URLs it printed, one a line (the primary's first), or
/// `None` (with a message) when it failed.
pub(crate) fn start_postgres(
    args: &[&str],
    auth: &str,
    env: &[(&str, &str)],
) -> Option<Vec<String>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/start-postgres");
    // Tests never install system packages; .ci/run's own start-postgres may.
    let output = Command::new(script)
        .args(args)
        .env("START_POSTGRES_NO_INSTALL", "1")
        .env("START_POSTGRES_AUTH", auth)
        .envs(env.iter().copied())
        .stderr(Stdio::inherit())
        .output();
    let urls: Vec<String> = match output {
        Ok(output) if output.status.success() => String::from_utf8(output.stdout)
            .ok()?
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect(),
        Ok(output) => {
            eprintln!("scripts/start-postgres failed ({})", output.status);
            return None;
        }
        Err(e) => {
            eprintln!("cannot run scripts/start-postgres: {e}");
            return None;
        }
    };
    if urls.is_empty() {
        eprintln!("scripts/start-postgres printed no URL");
        return None;
    }
    // Stop the clusters when this process exits, however it exits.
    let stop = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/stop-postgres");
    let quoted: Vec<String> = urls.iter().map(|url| format!("'{url}'")).collect();
    let watcher = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} {urls}",
        pid = std::process::id(),
        urls = quoted.join(" ")
    );
    let _ = Command::new("setsid")
        .args(["sh", "-c", &watcher])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    Some(urls)
}

/// A throwaway cluster that asks every role but `postgres` for its SCRAM password, or `None`
/// (with a message, and a failure under `SQLHTTPD_TEST_REQUIRE_POSTGRES`) when it cannot start.
pub(crate) fn password_cluster() -> Option<String> {
    let cluster = start_cluster("scram-sha-256");
    if cluster.is_none() {
        assert!(
            std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
            "cannot start a password-checking cluster, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
        );
        eprintln!("skipping: no PostgreSQL for scripts/start-postgres");
    }
    cluster
}

/// A fresh database on the cluster, or `None` (with a message) when there is no cluster.
pub(crate) async fn database(test: &str) -> Option<String> {
    let Some(url) = cluster() else {
        assert!(
            std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
            "no PostgreSQL for {test}, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
        );
        eprintln!(
            "skipping {test}: no PostgreSQL (set SQLHTTPD_TEST_POSTGRES_URL, or install the \
             postgresql package for scripts/start-postgres)"
        );
        return None;
    };
    Some(database_on(url).await)
}

/// A fresh database on the cluster at `url`.
pub(crate) async fn database_on(url: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "sqlhttp_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
    let (base, _) = url.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

/// The client role of the test database at `url`: each database has its own, as on a shared
/// cluster in production where a client role's password is its database's (see
/// `passwords_are_checked_as_in_production`).
pub(crate) fn client_role(url: &str) -> String {
    let (_, name) = url.rsplit_once('/').unwrap();
    name.replacen("sqlhttp_", "client_", 1)
}

/// A server configuration for the test database at `url`.
pub(crate) fn config(url: &str) -> Config {
    with_role(url, &client_role(url))
}

/// A server configuration for the database at `url` whose clients log in as `role`.
pub(crate) fn with_role(url: &str, role: &str) -> Config {
    let sqlhttp_server::Database::Postgres(url) = url.parse().unwrap() else {
        panic!("a PostgreSQL URL");
    };
    Config {
        database: sqlhttp_server::Database::Postgres(url.with_client_role(role).unwrap()),
        ..Config::default()
    }
}

/// An app on a fresh PostgreSQL database for `test`, with `tweak` applied to its
/// configuration; `None` (as [`database`]) when there is no PostgreSQL.
pub(crate) async fn app_on(test: &str, tweak: impl FnOnce(&mut Config)) -> Option<Router> {
    let url = database(test).await?;
    let mut config = config(&url);
    tweak(&mut config);
    Some(app(AppState::new(&config).unwrap()))
}

/// The app for `$test` on a fresh PostgreSQL database (as [`app_on`]), or `return` from the
/// test when there is no PostgreSQL.
macro_rules! postgres_app {
    ($test:expr) => {
        $crate::engines::postgres_app!($test, |_| {})
    };
    ($test:expr, $tweak:expr) => {
        match $crate::engines::app_on($test, $tweak).await {
            Some(router) => router,
            None => return,
        }
    };
}
pub(crate) use postgres_app;

/// A connection to the test database at `url` as the cluster's superuser (the server's owner,
/// as an operator's would be), its driver running in a task.
pub(crate) async fn owner(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A primary and its streaming replicas (hot standbys of the whole cluster), for the
/// read-replica tests: the URL of the `postgres` database on each, as the superuser.
#[derive(Debug)]
pub(crate) struct ReplicaCluster {
    /// The primary.
    pub(crate) primary: String,
    /// Its replicas, at least one.
    pub(crate) replicas: Vec<String>,
}

/// The replica cluster of this test process (see the module doc), or `None` (with a message,
/// and a failure under `SQLHTTPD_TEST_REQUIRE_POSTGRES`) when there is none for `test`.
pub(crate) fn replica_cluster(test: &str) -> Option<&'static ReplicaCluster> {
    static CLUSTER: OnceLock<Option<ReplicaCluster>> = OnceLock::new();
    let cluster = CLUSTER
        .get_or_init(|| {
            if let (Ok(primary), Ok(replicas)) = (
                std::env::var("SQLHTTPD_TEST_POSTGRES_URL"),
                std::env::var("SQLHTTPD_TEST_POSTGRES_REPLICA_URLS"),
            ) {
                let replicas: Vec<String> =
                    replicas.split_whitespace().map(str::to_owned).collect();
                if replicas.is_empty() {
                    eprintln!("SQLHTTPD_TEST_POSTGRES_REPLICA_URLS names no replica");
                    return None;
                }
                return Some(ReplicaCluster { primary, replicas });
            }
            let mut urls = start_postgres(&["--replica", "2"], "trust", &[])?;
            let primary = urls.remove(0);
            if urls.is_empty() {
                eprintln!("scripts/start-postgres --replica 2 printed no replica");
                return None;
            }
            Some(ReplicaCluster {
                primary,
                replicas: urls,
            })
        })
        .as_ref();
    if cluster.is_none() {
        assert!(
            std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
            "no PostgreSQL with replicas for {test}, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
        );
        eprintln!(
            "skipping {test}: no PostgreSQL with replicas (set SQLHTTPD_TEST_POSTGRES_URL and \
             SQLHTTPD_TEST_POSTGRES_REPLICA_URLS, or install the postgresql package for \
             scripts/start-postgres --replica 2)"
        );
    }
    cluster
}

/// A fresh database on a [`ReplicaCluster`]: its URL on the primary, and the same database's
/// URL on each replica (as the superuser).
#[derive(Debug)]
pub(crate) struct ReplicaDatabase {
    /// The database on the primary.
    pub(crate) primary: String,
    /// The same database on each replica, in the cluster's order.
    pub(crate) replicas: Vec<String>,
}

/// How long a replica may take to replay what the primary did before a test gives up on it.
const REPLAY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

impl ReplicaCluster {
    /// A fresh database on the primary, returned once every replica has replayed its creation.
    pub(crate) async fn database(&self) -> ReplicaDatabase {
        let primary = database_on(&self.primary).await;
        let (_, name) = primary.rsplit_once('/').unwrap();
        let replicas: Vec<String> = self
            .replicas
            .iter()
            .map(|replica| format!("{}/{name}", replica.rsplit_once('/').unwrap().0))
            .collect();
        let database = ReplicaDatabase { primary, replicas };
        database.caught_up().await;
        database
    }
}

impl ReplicaDatabase {
    /// Returns once every replica has replayed everything committed on the primary before
    /// this was called; panics past a generous deadline.
    pub(crate) async fn caught_up(&self) {
        let primary = owner(&self.primary).await;
        // The test clusters commit asynchronously: a commit's record may wait for the WAL
        // writer (up to `wal_writer_delay`) before it is flushed and sent. A transaction of our
        // own that writes (a logical message: no object is touched) and commits synchronously
        // flushes everything before it, and the flushed position is then past every commit
        // before this call. (A transaction that writes nothing but its commit is not flushed.)
        primary
            .batch_execute("SET synchronous_commit = on")
            .await
            .unwrap();
        primary
            .batch_execute("SELECT pg_logical_emit_message(true, 'sqlhttp-test', '')")
            .await
            .unwrap();
        let position: String = primary
            .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
            .await
            .unwrap()
            .get(0);
        for replica in &self.replicas {
            let started = std::time::Instant::now();
            loop {
                if replayed(replica, &position).await {
                    break;
                }
                assert!(
                    started.elapsed() < REPLAY_DEADLINE,
                    "the replica {replica} did not replay up to {position} in {REPLAY_DEADLINE:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

/// Whether the replica database at `url` exists there and has replayed up to `position` (an
/// LSN in PostgreSQL's text form).
async fn replayed(url: &str, position: &str) -> bool {
    let Ok((client, connection)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await else {
        // Not there yet: its CREATE DATABASE has not been replayed.
        return false;
    };
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
            &[&position],
        )
        .await
        .is_ok_and(|row| row.get::<_, Option<bool>>(0) == Some(true))
}
