//! An application whose statements are checked at compile time against its committed
//! `.sqlhttp/` cache (SQLite's types), built with no server (`SQLHTTP_OFFLINE=true`), then run
//! against a SQLite sqlhttpd: `SQLHTTP_URL=http://127.0.0.1:8080 cargo run -p sqlhttp-checked-sqlite`.
//! `.ci/run` builds and runs it; `sqlhttp prepare examples/checked/sqlite` refreshes its cache
//! (against a server holding [`SCHEMA`]).

#[path = "../../app.rs"]
mod app;

/// The table the statements use, as SQLite declares it.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS checked_books (id INTEGER PRIMARY KEY, \
                      title TEXT NOT NULL, year INTEGER, available BOOLEAN NOT NULL DEFAULT 1)";

#[tokio::main]
async fn main() -> sqlhttp::Result<()> {
    let url = std::env::var("SQLHTTP_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".to_owned());
    let mut builder = sqlhttp::Client::builder(url);
    if let Ok(token) = std::env::var("SQLHTTP_TOKEN") {
        builder = builder.bearer_token(token);
    }
    let client = builder.build()?;
    client.execute("DROP TABLE IF EXISTS checked_books").await?;
    client.execute(SCHEMA).await?;
    app::run(&client).await
}
