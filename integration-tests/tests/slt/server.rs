//! The one server every script runs on: the one at `SQLHTTP_TEST_URL` (bearer token in
//! `SQLHTTP_TEST_TOKEN`), or `sqlhttpd` started in-process on a private in-memory SQLite database.

use std::time::Duration;

use sqlhttp::{Client, RetryPolicy};
use sqlhttp_testkit::TestServer;

/// The server under test, and how to reach it.
pub(crate) struct Live {
    url: String,
    token: Option<String>,
    // Kept alive for the run's duration.
    server: Option<TestServer>,
}

impl Live {
    /// The server at `SQLHTTP_TEST_URL` when it is set, otherwise one started in-process.
    pub(crate) async fn start() -> Live {
        match std::env::var("SQLHTTP_TEST_URL") {
            Ok(url) => Live {
                url,
                token: std::env::var("SQLHTTP_TEST_TOKEN").ok(),
                server: None,
            },
            Err(_) => {
                let server = TestServer::start().await;
                Live {
                    url: server.url(),
                    token: server.config().tokens.first().cloned(),
                    server: Some(server),
                }
            }
        }
    }

    /// Where the server is, for the report (never the token).
    pub(crate) fn describe(&self) -> String {
        match self.server {
            Some(_) => format!("in-process sqlhttpd at {}", self.url),
            None => format!("sqlhttpd at {} (SQLHTTP_TEST_URL)", self.url),
        }
    }

    /// A client to the server. Reads retry with millisecond backoff; every attempt keeps the SDK's
    /// default timeout, so a hung statement fails its record instead of the whole run.
    pub(crate) fn client(&self) -> Client {
        let builder = Client::builder(&self.url).retry(
            RetryPolicy::new()
                .with_initial_backoff(Duration::from_millis(10))
                .with_max_backoff(Duration::from_millis(50))
                .with_jitter_seed(11),
        );
        match &self.token {
            Some(token) => builder.bearer_token(token.clone()),
            None => builder,
        }
        .build()
        .unwrap()
    }
}
