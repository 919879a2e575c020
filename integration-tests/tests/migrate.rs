//! Schema migrations end to end (`sqlhttp::migrate` through `sqlhttpd`), on SQLite and, when
//! `SQLHTTPD_TEST_POSTGRES_URL` names a cluster, on PostgreSQL: pending migrations applied in
//! order, a re-run that does nothing, connections cut around a migration's batch, two runs at
//! once, a changed file, revert and re-apply, a failing statement named by file and line, and the
//! test harness's isolated databases.
//!
//! Each test gets a fresh database from the harness (`TestServer::start()`): in memory on
//! SQLite, a database of its own on PostgreSQL (dropped after).

use std::time::Duration;

use sqlhttp::migrate::{MigrateError, Migration, MigrationStatus, Migrator};
use sqlhttp::{Client, ErrorKind, RetryPolicy};
use sqlhttp_testkit::{Fault, TestServer, TestServerBuilder};

/// The engines to run each test on: SQLite always, PostgreSQL when the environment names one.
fn engines() -> Vec<(&'static str, TestServerBuilder)> {
    let mut engines = vec![("sqlite", TestServer::start())];
    match std::env::var("SQLHTTPD_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => {
            engines.push(("postgres", TestServer::start().postgres(url)));
        }
        _ => {
            assert!(
                std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
                "SQLHTTPD_TEST_REQUIRE_POSTGRES is set but SQLHTTPD_TEST_POSTGRES_URL is not"
            );
            eprintln!("PostgreSQL skipped: SQLHTTPD_TEST_POSTGRES_URL is not set");
        }
    }
    engines
}

/// Three migrations: a table, a column with a down file, and a second table; each also logs a
/// row into `applied_log`, so running one twice would show.
fn three() -> Vec<Migration> {
    vec![
        Migration::new(
            1,
            "create_books",
            "CREATE TABLE applied_log (version INTEGER NOT NULL);\n\
             CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL);\n\
             INSERT INTO applied_log VALUES (1);\n",
        ),
        Migration::new(
            2,
            "add_isbn",
            "ALTER TABLE books ADD COLUMN isbn TEXT;\nINSERT INTO applied_log VALUES (2);\n",
        )
        .with_down(
            "ALTER TABLE books DROP COLUMN isbn;\nDELETE FROM applied_log WHERE version = 2;\n",
        ),
        Migration::new(
            3,
            "create_authors",
            "CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL);\n\
             INSERT INTO applied_log VALUES (3);\n",
        ),
    ]
}

fn migrator(migrations: &[Migration]) -> Migrator {
    Migrator::new(migrations.iter().cloned()).unwrap()
}

/// How many times each version's statements ran, from `applied_log`.
async fn log(client: &Client) -> Vec<(i64, i64)> {
    client
        .query("SELECT version, count(*) FROM applied_log GROUP BY version ORDER BY version")
        .fetch_all()
        .await
        .unwrap()
}

async fn statuses(migrator: &Migrator, client: &Client) -> Vec<(u64, MigrationStatus)> {
    migrator
        .info(client)
        .await
        .unwrap()
        .into_iter()
        .map(|line| (line.version, line.status))
        .collect()
}

async fn has_table(client: &Client, table: &str) -> bool {
    client.describe(table).await.unwrap().is_some()
}

fn one_attempt(builder: sqlhttp::ClientBuilder) -> Client {
    builder
        .retry(RetryPolicy::never())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test]
async fn pending_migrations_apply_in_order_and_a_rerun_is_a_no_op() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let migrator = migrator(&three());
        assert_eq!(
            statuses(&migrator, &client).await,
            [
                (1, MigrationStatus::Pending),
                (2, MigrationStatus::Pending),
                (3, MigrationStatus::Pending)
            ],
            "{engine}: info reads without creating anything"
        );
        assert!(!has_table(&client, "sqlhttp_migrations").await, "{engine}");

        let report = migrator.run(&client).await.unwrap();
        let applied: Vec<u64> = report.applied.iter().map(|a| a.version).collect();
        assert_eq!(applied, [1, 2, 3], "{engine}");
        assert_eq!(report.version, Some(3), "{engine}");
        assert!(report.applied.iter().all(|a| !a.by_another_run), "{engine}");
        assert_eq!(log(&client).await, [(1, 1), (2, 1), (3, 1)], "{engine}");

        let again = migrator.run(&client).await.unwrap();
        assert!(again.applied.is_empty(), "{engine}: {again:?}");
        assert_eq!(again.version, Some(3), "{engine}");
        assert_eq!(log(&client).await, [(1, 1), (2, 1), (3, 1)], "{engine}");
        let info = migrator.info(&client).await.unwrap();
        assert!(
            info.iter()
                .all(|line| line.status == MigrationStatus::Applied
                    && line.applied_at.is_some()
                    && line.duration.is_some()),
            "{engine}: {info:#?}"
        );

        // A migration added later is the only one the next run applies.
        let mut four = three();
        four.push(Migration::new(
            4,
            "index_titles",
            "CREATE INDEX books_title ON books (title);\nINSERT INTO applied_log VALUES (4);",
        ));
        let report = Migrator::new(four).unwrap().run(&client).await.unwrap();
        assert_eq!(
            report.applied.iter().map(|a| a.version).collect::<Vec<_>>(),
            [4],
            "{engine}"
        );
    }
}

#[tokio::test]
async fn a_cut_before_the_server_saw_a_migration_leaves_the_previous_version() {
    for (engine, start) in engines() {
        let server = start.await;
        let direct = server.client();
        migrator(&three()[..1]).run(&direct).await.unwrap();

        let proxy = server.proxy().await;
        let client = one_attempt(server.proxied_client_builder(&proxy));
        // The run asks whether the history exists, reads it (describe, select), asks which
        // engine it is on, then sends migration 2's batch: that request is cut before it
        // reaches the server.
        proxy.push_all([
            Fault::Pass,
            Fault::Pass,
            Fault::Pass,
            Fault::Pass,
            Fault::ResetBeforeForward,
        ]);
        let error = migrator(&three()).run(&client).await.unwrap_err();
        assert!(
            matches!(&error, MigrateError::Client { .. }),
            "{engine}: {error:?}"
        );
        assert!(
            error.to_string().contains("0002_add_isbn.sql"),
            "{engine}: {error}"
        );
        assert_eq!(
            proxy.forwarded(),
            4,
            "{engine}: the batch never reached the server"
        );
        assert_eq!(
            statuses(&migrator(&three()), &direct).await,
            [
                (1, MigrationStatus::Applied),
                (2, MigrationStatus::Pending),
                (3, MigrationStatus::Pending)
            ],
            "{engine}"
        );
        assert!(
            direct
                .describe("books")
                .await
                .unwrap()
                .unwrap()
                .iter()
                .all(|c| c.name != "isbn"),
            "{engine}"
        );

        // The next run completes it.
        let report = migrator(&three()).run(&client).await.unwrap();
        assert_eq!(
            report.applied.iter().map(|a| a.version).collect::<Vec<_>>(),
            [2, 3],
            "{engine}"
        );
        assert_eq!(log(&direct).await, [(1, 1), (2, 1), (3, 1)], "{engine}");
    }
}

#[tokio::test]
async fn a_lost_answer_is_settled_by_the_key_and_the_history_never_twice() {
    for (engine, start) in engines() {
        let server = start.await;
        let direct = server.client();
        let proxy = server.proxy().await;

        // Migration 1's batch is applied but its answer is lost, and this client does not
        // retry: the run fails, yet the server applied it. The next run sees it in the history.
        let once = one_attempt(server.proxied_client_builder(&proxy));
        proxy.push_all([
            Fault::Pass, // describe: no history
            Fault::Pass, // CREATE TABLE sqlhttp_migrations
            Fault::Pass, // describe
            Fault::Pass, // select
            Fault::Pass, // the engine
            Fault::DropAfterForward,
        ]);
        let error = migrator(&three()[..1]).run(&once).await.unwrap_err();
        assert!(error.client_error().is_some(), "{engine}: {error:?}");
        assert_eq!(
            statuses(&migrator(&three()[..1]), &direct).await,
            [(1, MigrationStatus::Applied)],
            "{engine}"
        );
        let report = migrator(&three()[..1]).run(&once).await.unwrap();
        assert!(report.applied.is_empty(), "{engine}");

        // A retrying client: migration 2's answer is lost, the retry carries the same key and
        // gets the stored outcome; it is this run's own write, applied once.
        let retrying = server
            .proxied_client_builder(&proxy)
            .retry(RetryPolicy::new().with_initial_backoff(Duration::from_millis(5)))
            .build()
            .unwrap();
        proxy.push_all([
            Fault::Pass,
            Fault::Pass,
            Fault::Pass,
            Fault::Pass,
            Fault::DropAfterForward,
        ]);
        let report = migrator(&three()[..2]).run(&retrying).await.unwrap();
        assert_eq!(report.applied.len(), 1, "{engine}: {report:?}");
        assert!(!report.applied[0].by_another_run, "{engine}");
        assert_eq!(log(&direct).await, [(1, 1), (2, 1)], "{engine}");
    }
}

#[tokio::test]
async fn two_runs_at_once_apply_each_migration_once() {
    for (engine, start) in engines() {
        let server = start.await;
        let migrations = three();
        let (a, b) = (server.client(), server.client());
        let (one, two) = (migrator(&migrations), migrator(&migrations));
        let (first, second) = tokio::join!(one.run(&a), two.run(&b));
        let (first, second) = (first.unwrap(), second.unwrap());
        assert_eq!(log(&a).await, [(1, 1), (2, 1), (3, 1)], "{engine}");
        // Each migration is reported by both runs; the history has one event per version.
        for report in [&first, &second] {
            assert_eq!(report.version, Some(3), "{engine}: {report:?}");
        }
        let events: Vec<(i64, i64)> = a
            .query("SELECT version, count(*) FROM sqlhttp_migrations GROUP BY version ORDER BY version")
            .fetch_all()
            .await
            .unwrap();
        assert_eq!(events, [(1, 1), (2, 1), (3, 1)], "{engine}");
    }
}

#[tokio::test]
async fn a_changed_applied_file_is_refused_with_its_name_and_both_checksums() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let original = three();
        migrator(&original[..2]).run(&client).await.unwrap();

        let mut changed = three();
        changed[1] = Migration::new(
            2,
            "add_isbn",
            "ALTER TABLE books ADD COLUMN isbn13 TEXT;\nINSERT INTO applied_log VALUES (2);\n",
        );
        let error = migrator(&changed).run(&client).await.unwrap_err();
        let MigrateError::ChecksumMismatch {
            version,
            file,
            applied,
            local,
        } = &error
        else {
            panic!("{engine}: {error:?}");
        };
        assert_eq!(
            (*version, file.as_str()),
            (2, "0002_add_isbn.sql"),
            "{engine}"
        );
        assert_eq!(applied, original[1].checksum(), "{engine}");
        assert_eq!(local, changed[1].checksum(), "{engine}");
        let message = error.to_string();
        assert!(
            message.contains(applied) && message.contains(local),
            "{engine}: {message}"
        );
        // Nothing ran: migration 3 stays pending, 2 ran once.
        assert_eq!(log(&client).await, [(1, 1), (2, 1)], "{engine}");
        assert_eq!(
            statuses(&migrator(&changed), &client).await[1].1,
            MigrationStatus::Changed {
                applied: original[1].checksum().to_owned()
            },
            "{engine}"
        );
    }
}

#[tokio::test]
async fn revert_undoes_the_last_and_it_can_be_applied_again() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let two = migrator(&three()[..2]);
        assert_eq!(
            two.revert(&client).await.unwrap(),
            None,
            "{engine}: nothing applied"
        );
        two.run(&client).await.unwrap();

        let reverted = two.revert(&client).await.unwrap().unwrap();
        assert_eq!(
            (reverted.version, reverted.name.as_str()),
            (2, "add_isbn"),
            "{engine}"
        );
        assert!(
            client
                .describe("books")
                .await
                .unwrap()
                .unwrap()
                .iter()
                .all(|c| c.name != "isbn"),
            "{engine}: the down file ran"
        );
        assert_eq!(
            statuses(&two, &client).await,
            [(1, MigrationStatus::Applied), (2, MigrationStatus::Pending)],
            "{engine}"
        );

        // Applied again after the revert: a new event under a new key, so it runs (a replay of
        // the first application's key would answer without running).
        let again = two.run(&client).await.unwrap();
        assert_eq!(again.applied.len(), 1, "{engine}");
        assert!(!again.applied[0].by_another_run, "{engine}");
        assert!(
            client
                .describe("books")
                .await
                .unwrap()
                .unwrap()
                .iter()
                .any(|c| c.name == "isbn"),
            "{engine}: applied again"
        );
        assert_eq!(log(&client).await, [(1, 1), (2, 1)], "{engine}");

        // And reverted again; migration 1 has no down file.
        two.revert(&client).await.unwrap().unwrap();
        let error = two.revert(&client).await.unwrap_err();
        assert!(
            matches!(&error, MigrateError::NoDown { version: 1, .. }),
            "{engine}: {error:?}"
        );
        assert!(
            error.to_string().contains("0001_create_books.down.sql"),
            "{engine}: {error}"
        );
    }
}

#[tokio::test]
async fn a_failing_statement_names_its_file_and_line_and_applies_nothing() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let mut migrations = three();
        migrations[1] = Migration::new(
            2,
            "broken",
            "CREATE TABLE half (x INTEGER);\n\n-- then\nINSERT INTO no_such_table VALUES (1);\n",
        );
        let error = migrator(&migrations).run(&client).await.unwrap_err();
        let MigrateError::Statement { file, line, source } = &error else {
            panic!("{engine}: {error:?}");
        };
        assert_eq!((file.as_str(), *line), ("0002_broken.sql", 4), "{engine}");
        assert!(
            matches!(source.kind(), ErrorKind::Sql { .. }),
            "{engine}: {source:?}"
        );
        assert!(
            !has_table(&client, "half").await,
            "{engine}: rolled back whole"
        );
        assert_eq!(
            statuses(&migrator(&migrations), &client).await,
            [
                (1, MigrationStatus::Applied),
                (2, MigrationStatus::Pending),
                (3, MigrationStatus::Pending)
            ],
            "{engine}"
        );
    }
}

#[tokio::test]
async fn out_of_order_and_missing_migrations_are_refused_unless_allowed() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let all = three();
        let skip_two = [all[0].clone(), all[2].clone()];
        migrator(&skip_two).run(&client).await.unwrap();

        let error = migrator(&all).run(&client).await.unwrap_err();
        assert!(
            matches!(
                &error,
                MigrateError::OutOfOrder {
                    version: 2,
                    applied: 3,
                    ..
                }
            ),
            "{engine}: {error:?}"
        );
        let report = migrator(&all)
            .allow_out_of_order(true)
            .run(&client)
            .await
            .unwrap();
        assert_eq!(report.applied.len(), 1, "{engine}");

        let error = migrator(&all[..1]).run(&client).await.unwrap_err();
        assert!(
            matches!(&error, MigrateError::Missing { version: 2, .. }),
            "{engine}: {error:?}"
        );
        let info = migrator(&all[..1]).info(&client).await.unwrap();
        assert_eq!(info[2].status, MigrationStatus::Missing, "{engine}");
        migrator(&all[..1])
            .ignore_missing(true)
            .run(&client)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_harness_gives_each_test_its_own_database_with_migrations_and_fixtures() {
    let dir = std::env::temp_dir().join(format!("sqlhttp-migrate-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("0001_create_books.sql"),
        "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL);\n",
    )
    .unwrap();
    std::fs::write(dir.join("README.md"), "not a migration").unwrap();
    for (engine, start) in engines() {
        let fixture =
            "INSERT INTO books VALUES (1, 'Dune');\nINSERT INTO books VALUES (2, 'Emma');";
        let a = start.migrations(&dir).fixture(fixture).await;
        let b = match engine {
            "postgres" => {
                let url = std::env::var("SQLHTTPD_TEST_POSTGRES_URL").unwrap();
                TestServer::start().postgres(url).migrations(&dir).await
            }
            _ => TestServer::start().migrations(&dir).await,
        };
        a.client()
            .execute("INSERT INTO books VALUES (3, 'Ulysses')")
            .await
            .unwrap();
        let in_a: i64 = a
            .client()
            .query("SELECT count(*) FROM books")
            .fetch_one()
            .await
            .unwrap();
        let in_b: i64 = b
            .client()
            .query("SELECT count(*) FROM books")
            .fetch_one()
            .await
            .unwrap();
        assert_eq!((in_a, in_b), (3, 0), "{engine}: the databases are separate");
        // The chaos proxy is one call away.
        let proxy = a.proxy().await;
        proxy.push(Fault::unavailable(0));
        let through = one_attempt(a.proxied_client_builder(&proxy));
        assert!(through.ping().await.is_err(), "{engine}");
        through.ping().await.unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_postgres_test_database_is_dropped_with_its_server() {
    let Ok(url) = std::env::var("SQLHTTPD_TEST_POSTGRES_URL") else {
        eprintln!("skipped: SQLHTTPD_TEST_POSTGRES_URL is not set");
        return;
    };
    let server = TestServer::start().postgres(url.clone()).await;
    server
        .client()
        .execute("CREATE TABLE t (x INTEGER)")
        .await
        .unwrap();
    let sqlhttp_server::Database::Postgres(db_url) = &server.config().database else {
        panic!("a PostgreSQL server");
    };
    let name = db_url.to_string().rsplit('/').next().unwrap().to_owned();
    let count = |url: String, name: String| async move {
        let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname = $1",
                &[&name],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    assert_eq!(count(url.clone(), name.clone()).await, 1);
    drop(server);
    assert_eq!(count(url, name).await, 0, "dropped with the server");
}

#[tokio::test]
async fn a_migration_that_failed_applies_once_its_cause_is_fixed() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let migrator = Migrator::new([Migration::new(
            1,
            "copy_owners",
            "CREATE TABLE things (owner TEXT);\nINSERT INTO things (owner) SELECT name FROM owners;\n",
        )])
        .unwrap();
        let first = migrator.run(&client).await.unwrap_err();
        assert!(first.to_string().contains("owners"), "{engine}: {first}");
        client
            .execute("CREATE TABLE owners (name TEXT)")
            .await
            .unwrap();
        client
            .execute("INSERT INTO owners VALUES ('ann')")
            .await
            .unwrap();
        // A new run is a new request: not the first one's stored failure.
        let report = migrator.run(&client).await.unwrap();
        assert_eq!(report.version, Some(1), "{engine}");
        let owners: Vec<String> = client
            .query("SELECT owner FROM things")
            .fetch_all()
            .await
            .unwrap();
        assert_eq!(owners, ["ann"], "{engine}");
    }
}

#[tokio::test]
async fn a_reset_database_is_migrated_again() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let migrator = migrator(&three()[..1]);
        migrator.run(&client).await.unwrap();
        for table in ["books", "applied_log", "sqlhttp_migrations"] {
            client.execute(format!("DROP TABLE {table}")).await.unwrap();
        }
        let report = migrator.run(&client).await.unwrap();
        assert_eq!(report.applied.len(), 1, "{engine}");
        assert!(!report.applied[0].by_another_run, "{engine}");
        assert!(
            has_table(&client, "books").await,
            "{engine}: applied, not replayed"
        );
    }
}

#[tokio::test]
async fn a_fixed_down_file_reverts() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let up = "CREATE TABLE t (x INTEGER);";
        let broken =
            Migrator::new([Migration::new(1, "t", up).with_down("DROP TABLE typo;")]).unwrap();
        broken.run(&client).await.unwrap();
        let error = broken.revert(&client).await.unwrap_err();
        assert!(
            matches!(&error, MigrateError::Statement { line: 1, .. }),
            "{engine}: {error:?}"
        );
        let fixed = Migrator::new([Migration::new(1, "t", up).with_down("DROP TABLE t;")]).unwrap();
        fixed.revert(&client).await.unwrap().unwrap();
        assert!(!has_table(&client, "t").await, "{engine}");
    }
}

#[tokio::test]
async fn of_runs_at_once_one_applies_and_the_others_say_so() {
    for (engine, start) in engines() {
        let server = start.await;
        let migrator = Migrator::new([Migration::new(
            1,
            "slowish",
            "CREATE TABLE t (x INTEGER);\n\
             INSERT INTO t WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 100000) SELECT n FROM c;\n",
        )])
        .unwrap();
        let runs: Vec<_> = (0..5)
            .map(|_| {
                let client = server.client();
                let migrator = migrator.clone();
                tokio::spawn(async move { migrator.run(&client).await.unwrap() })
            })
            .collect();
        let mut appliers = 0;
        for run in runs {
            let report = run.await.unwrap();
            assert_eq!(report.version, Some(1), "{engine}");
            appliers += report.applied.iter().filter(|a| !a.by_another_run).count();
        }
        let rows: i64 = server
            .client()
            .query("SELECT count(*) FROM t")
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(
            (rows, appliers),
            (100_000, 1),
            "{engine}: applied once, by one run"
        );
    }
}

#[tokio::test]
async fn a_run_racing_a_revert_leaves_a_history_that_matches_the_schema() {
    for (engine, start) in engines() {
        let server = start.await;
        let client = server.client();
        let mut migrations = three();
        migrations[2] = Migration::new(
            3,
            "slow_on_isbn",
            "CREATE TABLE filled (n INTEGER);\n\
             INSERT INTO filled WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 200000) SELECT n FROM c;\n\
             UPDATE books SET isbn = 'x' WHERE id < 0;\n",
        );
        migrator(&migrations[..2]).run(&client).await.unwrap();
        let running = {
            let (client, migrator) = (server.client(), migrator(&migrations));
            tokio::spawn(async move { migrator.run(&client).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let reverted = migrator(&migrations).revert(&client).await;
        let ran = running.await.unwrap();
        // Whichever came first, the history says what the schema is.
        let statuses = statuses(&migrator(&migrations), &client).await;
        let isbn = client
            .describe("books")
            .await
            .unwrap()
            .unwrap()
            .iter()
            .any(|c| c.name == "isbn");
        let applied = |v: usize| statuses[v - 1].1 == MigrationStatus::Applied;
        assert_eq!(
            applied(2),
            isbn,
            "{engine}: {statuses:?}, {ran:?}, {reverted:?}"
        );
        assert!(
            !applied(3) || applied(2),
            "{engine}: 3 applied over a reverted 2: {statuses:?}"
        );
        assert_eq!(applied(3), has_table(&client, "filled").await, "{engine}");
    }
}

#[tokio::test]
async fn on_sqlite_a_table_rebuild_keeps_the_rows_that_refer_to_it() {
    let server = TestServer::start().await;
    let client = server.client();
    let migrator = Migrator::from_files([
        (
            "0001_authors.sql",
            "CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT);\n\
             CREATE TABLE posts (id INTEGER PRIMARY KEY, author INTEGER REFERENCES authors ON DELETE CASCADE);\n\
             INSERT INTO authors VALUES (1, 'ann');\n\
             INSERT INTO posts VALUES (10, 1), (11, 1);\n",
        ),
        (
            // SQLite's twelve-step rebuild: name becomes NOT NULL.
            "0002_rebuild_authors.sql",
            "CREATE TABLE authors_new (id INTEGER PRIMARY KEY, name TEXT NOT NULL);\n\
             INSERT INTO authors_new SELECT id, name FROM authors;\n\
             DROP TABLE authors;\n\
             ALTER TABLE authors_new RENAME TO authors;\n",
        ),
    ])
    .unwrap();
    migrator.run(&client).await.unwrap();
    let posts: i64 = client
        .query("SELECT count(*) FROM posts")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(posts, 2, "the rebuild did not cascade into posts");
    // Foreign keys are enforced again afterwards.
    let orphan = client
        .execute("INSERT INTO posts VALUES (12, 99)")
        .await
        .unwrap_err();
    assert!(
        matches!(orphan.kind(), ErrorKind::ConstraintViolation { .. }),
        "{orphan:?}"
    );
    // A migration that leaves a row referring to nothing is refused whole, at commit.
    let dangling = Migrator::from_files([
        (
            "0001_authors.sql",
            migrator.migrations()[0].up_sql().to_owned(),
        ),
        (
            "0002_rebuild_authors.sql",
            migrator.migrations()[1].up_sql().to_owned(),
        ),
        (
            "0003_drop_ann.sql",
            "CREATE TABLE gone (x INTEGER);\nDELETE FROM authors WHERE id = 1;\n".to_owned(),
        ),
    ])
    .unwrap();
    let error = dangling.run(&client).await.unwrap_err();
    let source = error.client_error().expect("the server's answer");
    assert!(
        matches!(source.kind(), ErrorKind::ConstraintViolation { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("0003_drop_ann.sql"), "{error}");
    assert!(
        !has_table(&client, "gone").await,
        "nothing of it was applied"
    );
    let authors: i64 = client
        .query("SELECT count(*) FROM authors")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(authors, 1);
}
