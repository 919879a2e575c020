//! What the migrator's promise rests on: `sqlhttpd` killed (`SIGKILL`) while a migration's
//! statements run, after its first statement and before its last, leaves nothing of that
//! migration, on SQLite (a database file) and on PostgreSQL; started again, the next run
//! completes it. The migrator itself is tested end to end in `integration-tests/tests/migrate.rs`.

use std::process::Stdio;
use std::time::Duration;

use sqlhttp::migrate::{MigrationStatus, Migrator};
use sqlhttp::{Client, RetryPolicy};
use sqlhttp_testkit::ServerProcess;

use crate::common::sqlhttpd;
use crate::engines::{client_role, database, needs_postgres};

/// Migration 2 creates a table, then fills it for a few seconds, then creates another: the
/// kill lands in its second statement.
fn migrator(slow: &str) -> Migrator {
    Migrator::from_files([
        (
            "0001_create_books.sql",
            "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL);".to_owned(),
        ),
        (
            "0002_fill.sql",
            format!(
                "CREATE TABLE filled (n INTEGER NOT NULL);\n{slow};\nCREATE TABLE after_fill (n INTEGER);\n"
            ),
        ),
    ])
    .unwrap()
}

async fn spawn(args: &[&str]) -> ServerProcess {
    let mut command = sqlhttpd();
    command.args(args).stderr(Stdio::inherit());
    ServerProcess::spawn_command(command).await.unwrap()
}

fn client(server: &ServerProcess) -> Client {
    Client::builder(server.url())
        .retry(RetryPolicy::never())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn killed_mid_migration_then_completed(engine: &str, args: &[&str], slow: &str) {
    let server = spawn(args).await;
    let first = client(&server);
    Migrator::from_files([(
        "0001_create_books.sql",
        "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL);",
    )])
    .unwrap()
    .run(&first)
    .await
    .unwrap();

    let running = {
        let client = client(&server);
        let migrator = migrator(slow);
        tokio::spawn(async move { migrator.run(&client).await })
    };
    // The reads before the batch take milliseconds; the batch's second statement, seconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !running.is_finished(),
        "{engine}: the migration ended before the kill"
    );
    server.kill().await.unwrap();
    let error = running.await.unwrap().unwrap_err();
    assert!(error.client_error().is_some(), "{engine}: {error:?}");

    let server = spawn(args).await;
    let client = client(&server);
    let statuses: Vec<_> = migrator(slow)
        .info(&client)
        .await
        .unwrap()
        .into_iter()
        .map(|line| line.status)
        .collect();
    assert_eq!(
        statuses,
        [MigrationStatus::Applied, MigrationStatus::Pending],
        "{engine}"
    );
    assert!(
        client.describe("filled").await.unwrap().is_none(),
        "{engine}: nothing of the killed migration is left"
    );

    let report = migrator(slow).run(&client).await.unwrap();
    assert_eq!(report.version, Some(2), "{engine}");
    assert!(
        client.describe("after_fill").await.unwrap().is_some(),
        "{engine}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_migration_leaves_nothing_of_it_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("app.db").display());
    // About three seconds on a debug build.
    let slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 4000000) \
                INSERT INTO filled SELECT x FROM c";
    killed_mid_migration_then_completed("sqlite", &["--database", &url], slow).await;
}

needs_postgres! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kill_mid_migration_leaves_nothing_of_it_on_postgres() {
        let Some(url) = database("a_kill_mid_migration_leaves_nothing_of_it_on_postgres").await else {
            return;
        };
        let role = client_role(&url);
        let slow = "INSERT INTO filled SELECT 1 FROM pg_sleep(3)";
        killed_mid_migration_then_completed(
            "postgres",
            &["--database", &url, "--client-role", &role],
            slow,
        )
        .await;
    }
}
