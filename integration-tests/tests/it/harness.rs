//! The live server under test (and the engine behind it), unique table names, and seeded data
//! to compare against.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlhttp::{Client, ClientBuilder, RetryPolicy};
use sqlhttp_server::Config;
use sqlhttp_testkit::{ChaosProxy, TestServer};

/// A server to test against: `SQLHTTP_TEST_URL`, or `sqlhttpd` started in-process.
pub(crate) struct Live {
    url: String,
    token: Option<String>,
    // Kept alive for the test's duration.
    _server: Option<TestServer>,
}

impl Live {
    /// The default server: external when `SQLHTTP_TEST_URL` is set, otherwise in-process (in-memory).
    pub(crate) async fn start() -> Live {
        match std::env::var("SQLHTTP_TEST_URL") {
            Ok(url) => Live {
                url,
                token: std::env::var("SQLHTTP_TEST_TOKEN").ok(),
                _server: None,
            },
            Err(_) => Live::in_process(TestServer::start().await),
        }
    }

    /// An in-process server with a particular configuration (always in-process).
    pub(crate) async fn with_config(config: Config) -> Live {
        Live::in_process(TestServer::with_config(config).await)
    }

    fn in_process(server: TestServer) -> Live {
        Live {
            url: server.url(),
            token: server.config().tokens.first().cloned(),
            _server: Some(server),
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// A client builder straight to the server, with fast backoff.
    pub(crate) fn builder(&self) -> ClientBuilder {
        self.builder_for(&self.url)
    }

    /// A client straight to the server, with fast backoff.
    pub(crate) fn client(&self) -> Client {
        self.builder().build().unwrap()
    }

    /// A chaos proxy in front of the server.
    pub(crate) async fn proxy(&self) -> ChaosProxy {
        let addr = self
            .url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("the test server URL is http://HOST:PORT");
        ChaosProxy::start(addr).await.unwrap()
    }

    /// A client builder through `proxy`, with fast backoff.
    pub(crate) fn via(&self, proxy: &ChaosProxy) -> ClientBuilder {
        self.builder_for(&proxy.url())
    }

    fn builder_for(&self, url: &str) -> ClientBuilder {
        let builder = Client::builder(url).retry(fast());
        match &self.token {
            Some(token) => builder.bearer_token(token.clone()),
            None => builder,
        }
    }
}

/// The engine behind the server under test. The suite is engine-neutral; a test that only makes
/// sense on one engine asks [`Live::engine`] and says, in a comment, why it differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    Sqlite,
    Postgres,
}

/// The engine behind `client`'s server: only SQLite has `sqlite_version()`.
pub(crate) async fn engine_of(client: &Client) -> Engine {
    match client
        .query("SELECT sqlite_version()")
        .fetch_one::<String>()
        .await
    {
        Ok(_) => Engine::Sqlite,
        Err(_) => Engine::Postgres,
    }
}

impl Live {
    /// The engine behind this server.
    pub(crate) async fn engine(&self) -> Engine {
        engine_of(&self.client()).await
    }
}

/// Retries with millisecond backoff, so recovery is quick and jitter repeatable.
pub(crate) fn fast() -> RetryPolicy {
    RetryPolicy::new()
        .with_initial_backoff(Duration::from_millis(10))
        .with_max_backoff(Duration::from_millis(50))
        .with_jitter_seed(11)
}

/// A table name no other test uses, in this process or another one sharing the server.
pub(crate) fn unique_table(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A row of the tables the tests create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Item {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) price: f64,
    pub(crate) note: Option<String>,
}

/// `n` distinct items, with 64-bit ids, NULLs and text that needs escaping.
pub(crate) fn items(n: usize) -> Vec<Item> {
    (0..n as i64)
        .map(|i| Item {
            id: i64::MAX - i,
            name: format!("item \"{i}\" ünïcode ✓"),
            price: i as f64 * 1.25,
            note: (i % 3 == 0).then(|| format!("note {i}")),
        })
        .collect()
}

/// Creates `table` (with a primary key unless `keyed` is false) and inserts `n` items straight to the
/// server; returns them in id order.
pub(crate) async fn seed(client: &Client, table: &str, n: usize) -> Vec<Item> {
    create(client, table, true).await;
    let mut rows = items(n);
    assert_eq!(client.insert(table, &rows).await.unwrap(), n as u64);
    rows.sort_by_key(|item| item.id);
    rows
}

/// Creates an empty items table.
pub(crate) async fn create(client: &Client, table: &str, keyed: bool) {
    // SQLite's INTEGER PRIMARY KEY is the rowid, assigned when an insert leaves it out; on
    // PostgreSQL the same is a 64-bit identity column, with a double-precision price.
    let (id, price) = match (engine_of(client).await, keyed) {
        (Engine::Sqlite, true) => ("INTEGER PRIMARY KEY", "REAL"),
        (Engine::Sqlite, false) => ("INTEGER NOT NULL", "REAL"),
        (Engine::Postgres, true) => (
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            "DOUBLE PRECISION",
        ),
        (Engine::Postgres, false) => ("BIGINT NOT NULL", "DOUBLE PRECISION"),
    };
    client
        .execute(format!(
            "CREATE TABLE \"{table}\" (id {id}, name TEXT NOT NULL, price {price} NOT NULL, note TEXT)"
        ))
        .await
        .unwrap();
}

/// Every row of `table`, in id order, read straight from the server.
pub(crate) async fn all_rows(client: &Client, table: &str) -> Vec<Item> {
    client
        .query(format!(
            "SELECT id, name, price, note FROM \"{table}\" ORDER BY id"
        ))
        // What was committed (see `count`).
        .consistency(sqlhttp::Consistency::Primary)
        .fetch_all()
        .await
        .unwrap()
}

/// How many rows `table` holds.
pub(crate) async fn count(client: &Client, table: &str) -> i64 {
    // What was committed, whichever client wrote it: against a server with read replicas a
    // fresh client's read may be served by one that has not replayed the write yet.
    client
        .query(format!("SELECT count(*) FROM \"{table}\""))
        .consistency(sqlhttp::Consistency::Primary)
        .fetch_one()
        .await
        .unwrap()
}
