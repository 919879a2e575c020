//! Day two: the schema as numbered migration files (`examples/migrations/`), embedded in the
//! binary with `sqlhttp::migrations!` and applied by a `Migrator`, each as one atomic batch with
//! its record, exactly once however many instances start at the same time.
//!
//! ```text
//! cargo run --example migrate      # against an embedded sqlhttpd (in-memory SQLite)
//! ```
//!
//! The same files from the command line: `sqlhttp migrate run --source examples/migrations`.
//! `examples/tests/migrations.rs` tests an application against them with the testkit's harness.

use sqlhttp::Client;
use sqlhttp::migrate::MigrationStatus;
use sqlhttp_server::{Config, Server};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("migrate failed: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config {
        listen: "127.0.0.1:0".parse()?,
        ..Config::default()
    };
    let server = Server::bind(config).await?.spawn();
    let client = Client::builder(server.url()).build()?;

    // Embedded at compile time: nothing needs to be on disk where the binary runs.
    let migrator = sqlhttp::migrations![
        "migrations/0001_create_books.sql",
        "migrations/0002_add_isbn.sql",
        "migrations/0002_add_isbn.down.sql",
    ]?;

    let report = migrator.run(&client).await?;
    for applied in &report.applied {
        println!(
            "applied {:04}_{} in {:?}",
            applied.version, applied.name, applied.elapsed
        );
    }
    // A second run (another instance starting, say) finds nothing to do.
    let again = migrator.run(&client).await?;
    println!(
        "second run: {} applied, at version {:?}",
        again.applied.len(),
        again.version
    );

    client
        .execute("INSERT INTO books (title, year, isbn) VALUES (?, ?, ?)")
        .bind("Dune")
        .bind(1965)
        .bind("978-0441013593")
        .await?;

    // Back one version: the down file drops the column and its index.
    let reverted = migrator.revert(&client).await?;
    println!("reverted: {reverted:?}");
    for line in migrator.info(&client).await? {
        let status = match line.status {
            MigrationStatus::Applied => "applied",
            MigrationStatus::Pending => "pending",
            _ => "see sqlhttp migrate info",
        };
        println!("{:04}_{}: {status}", line.version, line.name);
    }
    server.shutdown().await;
    Ok(())
}
