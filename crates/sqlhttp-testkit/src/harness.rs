//! The test harness for applications (feature `harness`): what [`TestServerBuilder`] does
//! beyond starting a server: a fresh PostgreSQL database (and client role) per test, dropped
//! after it; the application's migrations applied through the SDK's `Migrator`; fixtures run as
//! batches.
//!
//! Knows PostgreSQL only as far as creating and dropping a database and a role; the server's
//! set-up on it is the server's, and the SQL of migrations and fixtures is the application's.
//!
//! [`TestServerBuilder`]: crate::TestServerBuilder

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlhttp::migrate::{MigrateError, Migrator};
use sqlhttp_server::{Config, Database};

use crate::TestServer;

/// The environment variable [`TestServerBuilder::postgres_from_env`] reads.
///
/// [`TestServerBuilder::postgres_from_env`]: crate::TestServerBuilder::postgres_from_env
pub(crate) const POSTGRES_URL_VAR: &str = "SQLHTTPD_TEST_POSTGRES_URL";

/// What to do around a server's start.
#[derive(Debug, Default)]
pub(crate) struct Setup {
    migrator: Option<Result<Migrator, MigrateError>>,
    fixtures: Vec<String>,
    postgres: Option<String>,
}

impl Setup {
    pub(crate) fn migrations(&mut self, dir: &Path) {
        self.migrator = Some(Migrator::from_dir(dir));
    }

    pub(crate) fn migrator(&mut self, migrator: Migrator) {
        self.migrator = Some(Ok(migrator));
    }

    pub(crate) fn fixture(&mut self, sql: String) {
        self.fixtures.push(sql);
    }

    pub(crate) fn postgres(&mut self, url: Option<String>) {
        self.postgres = url;
    }

    /// Creates the PostgreSQL database, when one was asked for, and points `config` at it.
    ///
    /// # Panics
    /// If the database cannot be created.
    pub(crate) async fn database(&self, config: &mut Config) -> Option<TestDatabase> {
        let admin_url = self.postgres.as_deref()?;
        let database = TestDatabase::create(admin_url).await;
        let Ok(Database::Postgres(url)) = database.url().parse::<Database>() else {
            panic!("sqlhttp-testkit: {admin_url:?} is not a PostgreSQL URL");
        };
        let url = url
            .with_client_role(&database.role)
            .unwrap_or_else(|error| panic!("sqlhttp-testkit: {error}"));
        config.database = Database::Postgres(url);
        Some(database)
    }

    /// Applies the migrations, then the fixtures, through a client of `server`.
    ///
    /// # Panics
    /// If a migration or a fixture fails: the message names it.
    pub(crate) async fn apply(&self, server: &TestServer) {
        let client = server.client();
        match &self.migrator {
            None => {}
            Some(Err(error)) => panic!("sqlhttp-testkit: the migrations cannot be read: {error}"),
            Some(Ok(migrator)) => {
                if let Err(error) = migrator.run(&client).await {
                    panic!("sqlhttp-testkit: the migrations failed: {error}");
                }
            }
        }
        for (index, fixture) in self.fixtures.iter().enumerate() {
            if let Err(error) = run_fixture(&client, fixture).await {
                panic!("sqlhttp-testkit: fixture {} failed: {error}", index + 1);
            }
        }
    }
}

/// Runs a fixture's statements in batches of at most 100 (the reference server's limit).
async fn run_fixture(client: &sqlhttp::Client, sql: &str) -> Result<(), String> {
    let split = sqlhttp::script::split(sql);
    let last = split
        .last_statement()
        .transpose()
        .map_err(|line| format!("the statement at line {line} does not end"))?;
    let statements: Vec<_> = split.statements.into_iter().chain(last).collect();
    for chunk in statements.chunks(100) {
        let mut batch = client.batch();
        for statement in chunk {
            batch = batch.statement(statement.sql.clone());
        }
        batch.await.map_err(|error| {
            let line = error
                .statement_index()
                .and_then(|index| chunk.get(index))
                .map_or(String::new(), |s| format!("statement at line {}: ", s.line));
            format!("{line}{error}")
        })?;
    }
    Ok(())
}

/// A fresh database and client role on a PostgreSQL cluster, dropped (with `FORCE`) on drop.
#[derive(Debug)]
pub(crate) struct TestDatabase {
    admin_url: String,
    name: String,
    role: String,
}

impl TestDatabase {
    async fn create(admin_url: &str) -> TestDatabase {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        // Unique on this machine (the host's tag) in this process (the counter), across
        // processes (the pid) and across runs that reuse a pid (the clock).
        let suffix = format!(
            "{}_{}_{}_{nanos}",
            host_tag(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let database = TestDatabase {
            admin_url: admin_url.to_owned(),
            name: format!("{DATABASE_PREFIX}{suffix}"),
            role: format!("{ROLE_PREFIX}{suffix}"),
        };
        let admin = connect(admin_url).await.unwrap_or_else(|error| {
            panic!("sqlhttp-testkit: cannot connect to PostgreSQL: {error}")
        });
        sweep(&admin).await;
        if let Err(error) = admin
            .batch_execute(&format!("CREATE DATABASE {}", database.name))
            .await
        {
            panic!(
                "sqlhttp-testkit: cannot create the database {}: {error}",
                database.name
            );
        }
        database
    }

    /// The admin URL with this database in place of its own.
    fn url(&self) -> String {
        with_database(&self.admin_url, &self.name)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        // Two messages: statements sent together run in one transaction, and DROP DATABASE
        // cannot run in one.
        let statements = [
            format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            format!("DROP ROLE IF EXISTS {}", self.role),
        ];
        // Drop may run inside the test's runtime, which cannot be blocked on: a thread of its
        // own runs the statements.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| error.to_string())?;
            runtime.block_on(async {
                let admin = connect(&admin_url).await.map_err(|e| e.to_string())?;
                for statement in &statements {
                    admin
                        .batch_execute(statement)
                        .await
                        .map_err(|e| format!("{statement}: {e}"))?;
                }
                Ok::<(), String>(())
            })
        })
        .join();
        // A test harness's cleanup that fails says so where the test's output goes.
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!(
                "sqlhttp-testkit: cannot drop the test database {}: {error}",
                self.name
            ),
            Err(_) => eprintln!(
                "sqlhttp-testkit: dropping the test database {} panicked",
                self.name
            ),
        }
    }
}

/// What every test database's name starts with, then [`host_tag`], the pid, a counter and a
/// clock.
const DATABASE_PREFIX: &str = "sqlhttp_test_";
/// What every test client role's name starts with, then the same suffix as its database.
const ROLE_PREFIX: &str = "sqlhttp_test_client_";

/// Eight hex digits naming this machine (a hash of its host name), so that a sweep never takes
/// another machine's test databases on a shared cluster for its own.
fn host_tag() -> String {
    use std::hash::{Hash as _, Hasher as _};
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.trim().hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}

/// Drops the test databases (and roles) of this machine whose process is gone: a test process
/// that was killed, or a server held past the process's end, cannot drop its own. Only where
/// `/proc` tells which processes live; failures are left for the next sweep.
async fn sweep(admin: &tokio_postgres::Client) {
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let mine = format!("{DATABASE_PREFIX}{}_", host_tag());
    let Ok(rows) = admin
        .query(
            "SELECT datname::text FROM pg_catalog.pg_database WHERE starts_with(datname::text, $1)",
            &[&mine],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let name: String = row.get(0);
        let Some(pid) = name[mine.len()..]
            .split('_')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let suffix = &name[DATABASE_PREFIX.len()..];
        for statement in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("DROP ROLE IF EXISTS {ROLE_PREFIX}{suffix}"),
        ] {
            if let Err(error) = admin.batch_execute(&statement).await {
                tracing::debug!(%error, %statement, "the sweep left a stale test database");
            }
        }
    }
}

/// A client on `url`, its connection driven by a task of the current runtime.
async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "the admin connection ended");
        }
    });
    Ok(client)
}

/// `url` with its database (the path) replaced by `name`; its query string is kept.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid no process has: above every live one, and checked.
    fn dead_pid() -> u32 {
        (4_000_000..4_194_304)
            .find(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
            .unwrap()
    }

    #[tokio::test]
    async fn stale_test_databases_of_gone_processes_are_swept() {
        let Ok(url) = std::env::var(POSTGRES_URL_VAR) else {
            eprintln!("skipped: {POSTGRES_URL_VAR} is not set");
            return;
        };
        let admin = connect(&url).await.unwrap();
        let stale = format!("{DATABASE_PREFIX}{}_{}_0_1", host_tag(), dead_pid());
        let other_host = format!("{DATABASE_PREFIX}00000000_{}_0_1", dead_pid());
        let alive = format!("{DATABASE_PREFIX}{}_{}_0_1", host_tag(), std::process::id());
        for name in [&stale, &other_host, &alive] {
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
        }
        // A new test database sweeps first.
        let fresh = TestDatabase::create(&url).await;
        let exists = |name: String| {
            let admin = &admin;
            async move {
                admin
                    .query_one(
                        "SELECT count(*) FROM pg_catalog.pg_database WHERE datname = $1",
                        &[&name],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
                    == 1
            }
        };
        assert!(
            !exists(stale.clone()).await,
            "a gone process's database is swept"
        );
        assert!(
            exists(other_host.clone()).await || host_tag() == "00000000",
            "another machine's stays"
        );
        assert!(exists(alive.clone()).await, "a live process's stays");
        drop(fresh);
        for name in [other_host, alive] {
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                .await
                .unwrap();
        }
    }

    #[test]
    fn database_urls() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres", "t"),
            "postgres://u@h:5432/t"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=disable", "t"),
            "postgres://u:p@h/t?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "t"), "postgres://u@h/t");
    }
}
