//! The whole path in one file: a typed `Client` talking to a live `sqlhttpd` over real HTTP.
//!
//! It pings, creates a table of its own, inserts typed rows, queries them back typed, prints a
//! `query_table` result as an aligned table, runs an `execute` and prints the rows it affected,
//! then drops the table it created. It touches nothing else: pointed at a server with data, it
//! leaves that data as it was.
//!
//! ```text
//! cargo run --example quickstart                       # embedded server, in-memory SQLite
//! SQLHTTP_URL=http://127.0.0.1:8080 SQLHTTP_TOKEN=secret cargo run --example quickstart
//! ```
//! With `SQLHTTP_TOKEN` set, the client sends it as a bearer token.

use serde::{Deserialize, Serialize};
use sqlhttp::{Client, Table, Value};
use sqlhttp_server::{Config, Server, ServerHandle};

#[derive(Debug, Serialize, Deserialize)]
struct Book {
    id: i64,
    title: String,
    author: String,
    year: Option<i64>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // `Display`, which says what went wrong and what to try; `Debug` is for bug reports.
            eprintln!("quickstart failed: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    // An embedded server unless the caller points us at one.
    let (url, _server): (String, Option<ServerHandle>) = match std::env::var("SQLHTTP_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let config = Config {
                listen: "127.0.0.1:0".parse()?,
                ..Config::default()
            };
            let server = Server::bind(config).await?.spawn();
            println!(
                "started an embedded sqlhttpd at {} (in-memory SQLite)",
                server.url()
            );
            (server.url(), Some(server))
        }
    };
    let mut builder = Client::builder(&url);
    if let Ok(token) = std::env::var("SQLHTTP_TOKEN") {
        builder = builder.bearer_token(token);
    }
    let client = builder.build()?;

    client.ping().await?;
    println!("ping: ok");

    // A table of this run's own: a name no earlier run (or user) took, dropped at the end.
    let table = format!(
        "quickstart_books_{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    client
        .execute(format!(
            "CREATE TABLE {table} (
                id INTEGER PRIMARY KEY, title TEXT NOT NULL, author TEXT NOT NULL, year INTEGER)"
        ))
        .await?;
    println!("created {table}");
    let outcome = tour(&client, &table).await;
    client.execute(format!("DROP TABLE {table}")).await?;
    println!("dropped {table}");
    outcome
}

/// Everything the quickstart shows, on its own `table`.
async fn tour(client: &Client, table: &str) -> Result<(), Box<dyn std::error::Error>> {
    let books = [
        Book {
            id: 1,
            title: "Dune".into(),
            author: "Frank Herbert".into(),
            year: Some(1965),
        },
        Book {
            id: 2,
            title: "The Dispossessed".into(),
            author: "Ursula K. Le Guin".into(),
            year: Some(1974),
        },
        Book {
            id: 3,
            title: "Neuromancer".into(),
            author: "William Gibson".into(),
            year: Some(1984),
        },
        Book {
            id: 4,
            title: "An Untitled Draft".into(),
            author: "Anonymous".into(),
            year: None,
        },
    ];
    let inserted = client.insert(table, &books).await?;
    println!("inserted {inserted} books");

    let classics: Vec<Book> = client
        .query(format!(
            "SELECT id, title, author, year FROM {table} WHERE year < ? ORDER BY year"
        ))
        .bind(1980)
        .fetch_all()
        .await?;
    println!("typed query, published before 1980:");
    for book in &classics {
        println!("  {book:?}");
    }
    let count: i64 = client
        .query(format!("SELECT count(*) FROM {table}"))
        .fetch_one()
        .await?;
    println!("count(*) = {count}");

    let shown = client
        .query_table(format!(
            "SELECT id, title, year, length(title) AS title_length FROM {table} ORDER BY id"
        ))
        .await?;
    println!("query_table:");
    print!("{}", render(&shown));

    let effect = client
        .execute(format!("UPDATE {table} SET year = ? WHERE year IS NULL"))
        .bind(2026)
        .await?;
    println!("execute: {} row(s) affected", effect.rows_affected);
    Ok(())
}

/// Renders a table with aligned columns and a header showing each column's type.
fn render(table: &Table) -> String {
    let header: Vec<String> = table
        .columns()
        .iter()
        .map(|c| match c.type_name() {
            "" => c.name().to_owned(),
            ty => format!("{} ({ty})", c.name()),
        })
        .collect();
    let cells: Vec<Vec<String>> = table
        .rows()
        .map(|row| row.values().iter().map(cell).collect())
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: &[String]| -> String {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        format!("  | {} |\n", padded.join(" | "))
    };
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let mut out = line(&header);
    out.push_str(&line(&rule));
    for row in &cells {
        out.push_str(&line(row));
    }
    out
}

fn cell(value: &Value) -> String {
    match value {
        Value::Null => "NULL".to_owned(),
        Value::Integer(i) => i.to_string(),
        Value::Real(f) => f.to_string(),
        Value::Text(s) => s.clone(),
        Value::Blob(b) => format!("<{} bytes>", b.len()),
        _ => "?".to_owned(),
    }
}
