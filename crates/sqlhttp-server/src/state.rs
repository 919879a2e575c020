//! [`AppState`]: what every request shares (the engine, the accepted tokens, the rate limiter,
//! the metrics, the body limit and timeout, the allowed origins, the idempotency settings and
//! the registry of keys in flight).
//!
//! Knows the engine's async handle and configuration values; it does not know routes or how
//! responses are shaped.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::budget::Budget;
use crate::config::{Config, Limits};
use crate::engine::{Backend, Engine as _};
use crate::error::ServerError;
use crate::http::auth::Tokens;
use crate::http::metrics::Metrics;
use crate::http::rate_limit::RateLimiter;
use crate::transactions::Transactions;
use crate::transactions::peers::{self, Peers};

/// Shared state of the HTTP app: build one with [`AppState::new`] and hand it to
/// [`app`](crate::app). Cloning is cheap; clones share one database.
///
/// ```
/// use sqlhttp_server::{AppState, Config, app};
///
/// let state = AppState::new(&Config::default())?;
/// let router: axum::Router = app(state);
/// # drop(router);
/// # Ok::<(), sqlhttp_server::ServerError>(())
/// ```
#[derive(Clone, Debug)]
pub struct AppState {
    pub(crate) inner: Arc<Shared>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    /// The engine, shared with the transaction layer, which asks it for sessions.
    pub(crate) engine: Arc<Backend>,
    pub(crate) tokens: Tokens,
    pub(crate) rate_limiter: Option<RateLimiter>,
    pub(crate) metrics: Metrics,
    pub(crate) max_body_bytes: usize,
    pub(crate) max_batch_bytes: usize,
    pub(crate) budget: Budget,
    pub(crate) body_timeout: Duration,
    pub(crate) limits: Limits,
    pub(crate) allow_origins: Vec<String>,
    pub(crate) idempotency_ttl: Option<Duration>,
    /// The open interactive transactions and the finished ones' outcomes.
    pub(crate) transactions: Arc<Transactions>,
    /// The peers (other sqlhttpd processes on the same database), for the transactions they
    /// hold.
    pub(crate) peers: Arc<Peers>,
    in_flight: Mutex<HashSet<String>>,
}

impl AppState {
    /// Opens the configured database (creating the idempotency table when the feature is on)
    /// and starts its engine thread. `config.listen` is not used here. This blocks while the
    /// database opens; from async code prefer [`Server::bind`](crate::Server::bind).
    pub fn new(config: &Config) -> Result<AppState, ServerError> {
        let tokens = Tokens::new(
            config.tokens.iter().map(String::as_str),
            config.read_tokens.iter().map(String::as_str),
        )?;
        let needs = config
            .limits
            .max_result_bytes
            .saturating_add(config.max_body_bytes.max(config.max_batch_bytes));
        if config.max_buffered_bytes < needs {
            return Err(ServerError::BufferBudgetTooSmall {
                budget: config.max_buffered_bytes,
                needs,
            });
        }
        let budget = Budget::new(config.max_buffered_bytes);
        let engine = Arc::new(Backend::start(
            &config.database,
            &config.read_replicas,
            config.idempotency_ttl,
            config.limits,
            budget.clone(),
        )?);
        let transactions = Arc::new(Transactions::new(
            Arc::clone(&engine),
            config.transactions,
            config.idempotency_ttl,
            config.limits.max_result_bytes,
            budget.clone(),
        ));
        let peers = Arc::new(Peers::new(
            transactions.instance().to_owned(),
            config.advertise_url.clone(),
            Arc::clone(&engine),
        ));
        Ok(AppState {
            inner: Arc::new(Shared {
                engine,
                tokens,
                rate_limiter: config.rate_limit.map(RateLimiter::new),
                metrics: Metrics::new(),
                max_body_bytes: config.max_body_bytes,
                max_batch_bytes: config.max_batch_bytes,
                budget: budget.clone(),
                body_timeout: config.http.body_timeout,
                limits: config.limits,
                allow_origins: config.http.allow_origins.clone(),
                idempotency_ttl: config.idempotency_ttl,
                transactions,
                peers,
                in_flight: Mutex::new(HashSet::new()),
            }),
        })
    }

    /// Closes the database: waits for queued work, interrupts a statement still running, and
    /// returns once the connection is dropped. Requests after this answer 503.
    pub(crate) async fn close(&self) {
        // No rollback below waits for a statement that runs on (ADR 0042).
        self.inner.engine.stop_transactions();
        self.inner.transactions.close().await;
        peers::leave(&self.inner.peers).await;
        self.inner.engine.close().await;
    }
}

impl Shared {
    /// Marks `key` as running; `None` when a request with the same key is already running.
    /// The key is released when the returned guard drops.
    pub(crate) fn claim(self: &Arc<Self>, key: &str) -> Option<KeyGuard> {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        in_flight.insert(key.to_owned()).then(|| KeyGuard {
            shared: Arc::clone(self),
            key: key.to_owned(),
        })
    }
}

/// Holds an Idempotency-Key in the in-flight registry until dropped.
#[derive(Debug)]
pub(crate) struct KeyGuard {
    shared: Arc<Shared>,
    key: String,
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        self.shared
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}
