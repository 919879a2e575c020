//! The server's numbers for `GET /metrics`, in the OpenMetrics text format Prometheus scrapes
//! (the `prometheus-client` crate's encoder): requests by endpoint and status, a latency
//! histogram per endpoint, engine queue depth per pool, engine connections given up (ADR 0032),
//! counts of rate-limited requests, replayed idempotent outcomes and statement timeouts, and
//! the interactive transactions open, committed, rolled back, expired and aborted, and the read
//! replicas' health and lag with the reads each kind of node served.
//!
//! Knows metric names and label sets; the request log feeds it one observation per request. No
//! label ever carries a credential, a statement or a value: endpoints are route patterns, so
//! the series are bounded.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::engine::{Engine as _, GivenUp, ReplicaReport};
use crate::protocol::error::ApiError;
use crate::state::AppState;
use crate::transactions::TransactionCounts;

/// The media type of the exposition.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Latency buckets, in seconds: a millisecond to the default statement timeout.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PoolLabels {
    pool: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReplicaLabels {
    replica: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReadLabels {
    served_by: &'static str,
    reason: &'static str,
}

/// The read replicas' series, brought up to the engine's report at each render.
#[derive(Debug, Default)]
struct ReplicaMetrics {
    healthy: Family<ReplicaLabels, Gauge>,
    lag: Family<ReplicaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    reads: Family<ReadLabels, Counter>,
    sync: Mutex<()>,
}

impl ReplicaMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "replica_healthy",
            "Whether each read replica answers and replays the primary's log (1) or not (0)",
            self.healthy.clone(),
        );
        registry.register_with_unit(
            "replica_lag",
            "How far behind the primary each read replica was when last asked",
            Unit::Seconds,
            self.lag.clone(),
        );
        registry.register(
            "replica_reads",
            "Reads by who served them (replica, primary) and why (routed: a replica was fit; \
             asked: Sqlhttp-Consistency: primary; no_replica: none healthy and close enough; \
             behind: none had replayed the bookmark in time; failed: the replica failed it)",
            self.reads.clone(),
        );
    }

    fn update(&self, report: &ReplicaReport) {
        let _sync = self.sync.lock().unwrap_or_else(PoisonError::into_inner);
        for (index, replica) in report.replicas.iter().enumerate() {
            let labels = ReplicaLabels {
                replica: index.to_string(),
            };
            self.healthy
                .get_or_create(&labels)
                .set(i64::from(replica.healthy));
            self.lag.get_or_create(&labels).set(replica.lag_seconds);
        }
        for &(served_by, reason, total) in &report.reads {
            let counter = self.reads.get_or_create(&ReadLabels { served_by, reason });
            let counted = counter.get();
            if total > counted {
                counter.inc_by(total - counted);
            }
        }
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// What one finished request adds to the metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observation {
    /// The matched route pattern, or `None` for a path no route matched.
    pub(crate) endpoint: Option<&'static str>,
    pub(crate) status: u16,
    pub(crate) elapsed: Duration,
    pub(crate) replayed: bool,
    pub(crate) statement_timeout: bool,
}

/// Every metric, registered once; cheap to update from any task.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    queue_depth: Family<PoolLabels, Gauge>,
    given_up: Counter,
    /// Serializes bringing [`Metrics::given_up`] up to the engine's total.
    given_up_sync: Mutex<()>,
    given_up_running: Gauge,
    /// The SQLite write-ahead log's size (ADR 0046); not registered on PostgreSQL.
    wal: Gauge,
    rate_limited: Counter,
    replayed: Counter,
    statement_timeouts: Counter,
    /// What the server's buffer budget holds now (`--max-buffered-bytes`).
    buffered: Gauge,
    transactions: TransactionMetrics,
    replicas: ReplicaMetrics,
}

/// The interactive transactions' series, brought up to the registry's counts at each render.
#[derive(Debug, Default)]
struct TransactionMetrics {
    open: Gauge,
    commits: Counter,
    rollbacks: Counter,
    expirations: Counter,
    aborts: Counter,
    sync: Mutex<()>,
}

impl TransactionMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "transactions_open",
            "Interactive transactions open now",
            self.open.clone(),
        );
        registry.register(
            "transaction_commits",
            "Interactive transactions committed",
            self.commits.clone(),
        );
        registry.register(
            "transaction_rollbacks",
            "Interactive transactions rolled back by their clients (or by a failed COMMIT)",
            self.rollbacks.clone(),
        );
        registry.register(
            "transaction_expirations",
            "Interactive transactions the server rolled back: idle past the timeout, open past \
             the lifetime cap, or at shutdown",
            self.expirations.clone(),
        );
        registry.register(
            "transaction_aborts",
            "Interactive transactions that could not go on: serialization failures, deadlocks, \
             lost connections",
            self.aborts.clone(),
        );
    }

    fn update(&self, counts: TransactionCounts) {
        let _sync = self.sync.lock().unwrap_or_else(PoisonError::into_inner);
        self.open
            .set(i64::try_from(counts.open).unwrap_or(i64::MAX));
        for (counter, total) in [
            (&self.commits, counts.commits),
            (&self.rollbacks, counts.rollbacks),
            (&self.expirations, counts.expirations),
            (&self.aborts, counts.aborts),
        ] {
            let counted = counter.get();
            if total > counted {
                counter.inc_by(total - counted);
            }
        }
    }
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sqlhttpd");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered, by endpoint (route pattern) and status",
            requests.clone(),
        );
        let latency: Family<EndpointLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to its response head, by endpoint",
            Unit::Seconds,
            latency.clone(),
        );
        let queue_depth = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "engine_queue_depth",
            "Statements waiting for an engine connection, by pool (writer, reader)",
            queue_depth.clone(),
        );
        let given_up = Counter::default();
        registry.register(
            "engine_given_up",
            "Engine connections given up because their statement had not stopped a second \
             after its timeout, its client's leaving or shutdown",
            given_up.clone(),
        );
        let given_up_running = Gauge::default();
        registry.register(
            "engine_given_up_running",
            "Given-up engine connections whose statement still runs on its own thread",
            given_up_running.clone(),
        );
        let wal = Gauge::default();
        registry.register_with_unit(
            "sqlite_wal",
            "The SQLite database's write-ahead log on disk, as the engine last saw it (every \
             100 ms): truncated past a quarter of --max-wal-bytes; past --max-wal-bytes writes \
             wait (0 on PostgreSQL)",
            Unit::Bytes,
            wal.clone(),
        );
        let rate_limited = Counter::default();
        registry.register(
            "rate_limited",
            "Requests refused with 429 RATE_LIMITED",
            rate_limited.clone(),
        );
        let replayed = Counter::default();
        registry.register(
            "idempotent_replays",
            "Requests answered with a stored Idempotency-Key outcome",
            replayed.clone(),
        );
        let statement_timeouts = Counter::default();
        registry.register(
            "statement_timeouts",
            "Statements interrupted by the statement timeout (422 STATEMENT_TIMEOUT)",
            statement_timeouts.clone(),
        );
        let buffered = Gauge::default();
        registry.register_with_unit(
            "buffered",
            "What requests make the server buffer now, held against --max-buffered-bytes: \
             request bodies, whole results and answers until sent, transactions' stored \
             results (in whole KiB)",
            Unit::Bytes,
            buffered.clone(),
        );
        let transactions = TransactionMetrics::default();
        transactions.register(&mut registry);
        let replicas = ReplicaMetrics::default();
        replicas.register(&mut registry);
        Metrics {
            replicas,
            transactions,
            registry,
            requests,
            latency,
            queue_depth,
            given_up,
            given_up_sync: Mutex::new(()),
            given_up_running,
            wal,
            rate_limited,
            replayed,
            statement_timeouts,
            buffered,
        }
    }

    /// Sets the SQLite write-ahead log's size, for the next render.
    pub(crate) fn set_wal_bytes(&self, bytes: u64) {
        self.wal.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets what the buffer budget holds now, for the next render.
    pub(crate) fn set_buffered(&self, bytes: usize) {
        self.buffered.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts one finished request.
    pub(crate) fn observe(&self, observation: Observation) {
        let endpoint = observation.endpoint.unwrap_or("unmatched");
        self.requests
            .get_or_create(&RequestLabels {
                endpoint,
                status: observation.status,
            })
            .inc();
        self.latency
            .get_or_create(&EndpointLabels { endpoint })
            .observe(observation.elapsed.as_secs_f64());
        if observation.status == 429 {
            self.rate_limited.inc();
        }
        if observation.replayed {
            self.replayed.inc();
        }
        if observation.statement_timeout {
            self.statement_timeouts.inc();
        }
    }

    /// The exposition text, with the queue depths and given-up connections as they are now.
    pub(crate) fn render(
        &self,
        queue_depths: &[(&'static str, usize)],
        given_up: GivenUp,
        transactions: TransactionCounts,
        replicas: &ReplicaReport,
    ) -> String {
        self.transactions.update(transactions);
        self.replicas.update(replicas);
        {
            let _sync = self
                .given_up_sync
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let counted = self.given_up.get();
            if given_up.total > counted {
                self.given_up.inc_by(given_up.total - counted);
            }
        }
        self.given_up_running
            .set(i64::try_from(given_up.running).unwrap_or(i64::MAX));
        for (pool, depth) in queue_depths {
            let depth = i64::try_from(*depth).unwrap_or(i64::MAX);
            self.queue_depth
                .get_or_create(&PoolLabels { pool })
                .set(depth);
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let shared = &state.inner;
    shared.metrics.set_buffered(shared.budget.held_bytes());
    if let Some(wal) = shared.engine.wal_bytes() {
        shared.metrics.set_wal_bytes(wal);
    }
    let text = shared.metrics.render(
        &shared.engine.queue_depths(),
        shared.engine.given_up(),
        shared.transactions.counts(),
        &shared.engine.replicas(),
    );
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// Any method but `GET` on `/metrics`.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed("GET, HEAD")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe(metrics: &Metrics, endpoint: Option<&'static str>, status: u16, millis: u64) {
        metrics.observe(Observation {
            endpoint,
            status,
            elapsed: Duration::from_millis(millis),
            replayed: false,
            statement_timeout: false,
        });
    }

    #[test]
    fn the_exposition_has_every_family() {
        let metrics = Metrics::new();
        observe(&metrics, Some("/api/v1/sql"), 200, 3);
        observe(&metrics, Some("/api/v1/sql"), 200, 700);
        observe(&metrics, Some("/api/v1/sql"), 429, 0);
        observe(&metrics, None, 404, 0);
        metrics.observe(Observation {
            endpoint: Some("/api/v1/sql"),
            status: 200,
            elapsed: Duration::ZERO,
            replayed: true,
            statement_timeout: false,
        });
        metrics.observe(Observation {
            endpoint: Some("/api/v1/sql"),
            status: 422,
            elapsed: Duration::ZERO,
            replayed: false,
            statement_timeout: true,
        });
        let text = metrics.render(
            &[("writer", 2), ("reader", 0)],
            GivenUp {
                running: 1,
                total: 3,
            },
            TransactionCounts {
                open: 2,
                commits: 5,
                rollbacks: 1,
                expirations: 3,
                aborts: 4,
            },
            &ReplicaReport {
                replicas: vec![crate::engine::ReplicaState {
                    healthy: true,
                    lag_seconds: 0.25,
                }],
                reads: vec![("replica", "routed", 7), ("primary", "behind", 2)],
            },
        );
        for line in [
            "# TYPE sqlhttpd_requests counter",
            r#"sqlhttpd_requests_total{endpoint="/api/v1/sql",status="200"} 3"#,
            r#"sqlhttpd_requests_total{endpoint="/api/v1/sql",status="429"} 1"#,
            r#"sqlhttpd_requests_total{endpoint="unmatched",status="404"} 1"#,
            "# TYPE sqlhttpd_request_duration_seconds histogram",
            "# UNIT sqlhttpd_request_duration_seconds seconds",
            r#"sqlhttpd_request_duration_seconds_bucket{le="0.005",endpoint="/api/v1/sql"} 4"#,
            r#"sqlhttpd_request_duration_seconds_bucket{le="+Inf",endpoint="/api/v1/sql"} 5"#,
            r#"sqlhttpd_request_duration_seconds_count{endpoint="/api/v1/sql"} 5"#,
            r#"sqlhttpd_engine_queue_depth{pool="writer"} 2"#,
            r#"sqlhttpd_engine_queue_depth{pool="reader"} 0"#,
            "sqlhttpd_engine_given_up_total 3",
            "sqlhttpd_engine_given_up_running 1",
            "sqlhttpd_rate_limited_total 1",
            "sqlhttpd_idempotent_replays_total 1",
            "sqlhttpd_statement_timeouts_total 1",
            "sqlhttpd_buffered_bytes 0",
            "sqlhttpd_transactions_open 2",
            "sqlhttpd_transaction_commits_total 5",
            "sqlhttpd_transaction_rollbacks_total 1",
            "sqlhttpd_transaction_expirations_total 3",
            "sqlhttpd_transaction_aborts_total 4",
            r#"sqlhttpd_replica_healthy{replica="0"} 1"#,
            r#"sqlhttpd_replica_lag_seconds{replica="0"} 0.25"#,
            r#"sqlhttpd_replica_reads_total{served_by="replica",reason="routed"} 7"#,
            r#"sqlhttpd_replica_reads_total{served_by="primary",reason="behind"} 2"#,
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
