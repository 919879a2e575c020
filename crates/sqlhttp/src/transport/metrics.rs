//! The client's metrics, with the `opentelemetry` feature: `db.client.operation.duration` (a
//! histogram in seconds per call, by OpenTelemetry's database conventions, with `error.type` when
//! the call failed) and the counters an outage is read from: `sqlhttp.client.attempts`,
//! `sqlhttp.client.retries` (by the failure's `error.type`),
//! `sqlhttp.client.retry_budget.refusals`, `sqlhttp.client.rate.refusals` (calls the adaptive rate
//! refused) and `sqlhttp.client.hedges`, and as gauges recorded when each call ends, the state
//! [`Client::retry_state`](crate::Client::retry_state) shows: `sqlhttp.client.retry_budget.tokens`
//! and `sqlhttp.client.send_rate`. They are recorded through the meter of the global meter
//! provider installed when the client is built (`opentelemetry::global::meter`); gauges are
//! recorded, not observed, so no callback outlives a client.
//!
//! Without the feature, [`Metrics`] has no fields and every method is empty: a call pays nothing.
//! This module knows the instruments' names and attributes; it does not know retry rules (the
//! loop says what happened) nor spans (`trace` has those).

use crate::error::ErrorKind;
use crate::retry::RetryState;

use super::trace::TraceSettings;

/// The client's instruments (none without the `opentelemetry` feature).
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    #[cfg(feature = "opentelemetry")]
    inner: Option<std::sync::Arc<otel::Instruments>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The instruments of a client built now, for the server `settings` names.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    pub(crate) fn new(settings: &TraceSettings) -> Self {
        Self {
            #[cfg(feature = "opentelemetry")]
            inner: Some(std::sync::Arc::new(otel::Instruments::new(settings))),
        }
    }

    /// One call, begun at `started`, ended: `Err` with its failure's kind. `sql` gives the
    /// operation's name (its first word); `engine` the `db.system.name` when an answer named it;
    /// `state` the client's retry state then (each asked for only when metrics are recorded).
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    #[inline]
    pub(crate) fn call_ended<'a>(
        &self,
        started: tokio::time::Instant,
        sql: &str,
        engine: impl FnOnce() -> Option<&'a str>,
        failure: Option<&ErrorKind>,
        state: impl FnOnce() -> RetryState,
    ) {
        #[cfg(feature = "opentelemetry")]
        if let Some(inner) = &self.inner {
            inner.call_ended(started.elapsed(), sql, engine(), failure);
            inner.state(&state(), failure);
        }
    }

    /// An attempt is being sent.
    #[inline]
    pub(crate) fn attempt(&self) {
        #[cfg(feature = "opentelemetry")]
        if let Some(inner) = &self.inner {
            inner.attempts.add(1, &inner.server);
        }
    }

    /// A failed attempt is being retried.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    #[inline]
    pub(crate) fn retry(&self, failure: &ErrorKind) {
        #[cfg(feature = "opentelemetry")]
        if let Some(inner) = &self.inner {
            inner.retry(failure);
        }
    }

    /// The retry budget refused a retry.
    #[inline]
    pub(crate) fn budget_refused(&self) {
        #[cfg(feature = "opentelemetry")]
        if let Some(inner) = &self.inner {
            inner.budget_refusals.add(1, &inner.server);
        }
    }
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use std::time::Duration;

    use std::sync::atomic::{AtomicU64, Ordering};

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::{Counter, Gauge, Histogram};

    use super::TraceSettings;
    use crate::error::ErrorKind;
    use crate::retry::RetryState;
    use crate::transport::trace::error_type;

    /// The boundaries the conventions advise for `db.client.operation.duration`, in seconds.
    const DURATION_BOUNDARIES: [f64; 9] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];

    /// The operations whose names a measurement takes without an allocation.
    const OPERATIONS: [&str; 12] = [
        "SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "BATCH", "BEGIN", "COMMIT", "ROLLBACK",
        "OUTCOME", "CREATE", "DROP",
    ];
    /// The engines whose names a measurement takes without an allocation.
    const ENGINES: [&str; 2] = ["sqlite", "postgresql"];

    /// `db.operation.name`: the statement's first word in capitals, without an allocation when
    /// it is a common one.
    fn operation(word: &str) -> opentelemetry::Value {
        match OPERATIONS
            .iter()
            .find(|known| known.eq_ignore_ascii_case(word))
        {
            Some(known) => opentelemetry::Value::from(*known),
            None => opentelemetry::Value::from(word.to_ascii_uppercase()),
        }
    }

    /// `db.system.name`, without an allocation when it is a known engine.
    fn engine(name: &str) -> opentelemetry::Value {
        match ENGINES.iter().find(|known| **known == name) {
            Some(known) => opentelemetry::Value::from(*known),
            None => opentelemetry::Value::from(name.to_owned()),
        }
    }

    pub(super) struct Instruments {
        duration: Histogram<f64>,
        pub(super) attempts: Counter<u64>,
        retries: Counter<u64>,
        pub(super) budget_refusals: Counter<u64>,
        rate_refusals: Counter<u64>,
        hedges: Counter<u64>,
        /// The hedges already counted: the client's count only grows, and each call ending adds
        /// what it grew by since (the greatest seen, so concurrent endings count each once).
        hedges_counted: AtomicU64,
        budget_tokens: Gauge<u64>,
        send_rate: Gauge<f64>,
        /// `server.address` and `server.port`, on every measurement.
        pub(super) server: Vec<KeyValue>,
    }

    impl Instruments {
        pub(super) fn new(settings: &TraceSettings) -> Self {
            let meter = opentelemetry::global::meter("sqlhttp");
            let mut server = Vec::new();
            if let Some(address) = &settings.server_address {
                // Shared, so a measurement's copy of it is a reference count.
                let address: std::sync::Arc<str> = address.as_str().into();
                server.push(KeyValue::new(
                    "server.address",
                    opentelemetry::StringValue::from(address),
                ));
            }
            if let Some(port) = settings.server_port {
                server.push(KeyValue::new("server.port", i64::from(port)));
            }
            Self {
                duration: meter
                    .f64_histogram("db.client.operation.duration")
                    .with_unit("s")
                    .with_description("Duration of database client operations.")
                    .with_boundaries(DURATION_BOUNDARIES.to_vec())
                    .build(),
                attempts: meter
                    .u64_counter("sqlhttp.client.attempts")
                    .with_unit("{attempt}")
                    .with_description("Attempts sent, the first of each call included.")
                    .build(),
                retries: meter
                    .u64_counter("sqlhttp.client.retries")
                    .with_unit("{retry}")
                    .with_description("Failed attempts sent again, by the failure's error.type.")
                    .build(),
                budget_refusals: meter
                    .u64_counter("sqlhttp.client.retry_budget.refusals")
                    .with_unit("{refusal}")
                    .with_description("Retries the retry budget refused.")
                    .build(),
                rate_refusals: meter
                    .u64_counter("sqlhttp.client.rate.refusals")
                    .with_unit("{call}")
                    .with_description("Calls the adaptive client rate refused to send.")
                    .build(),
                hedges: meter
                    .u64_counter("sqlhttp.client.hedges")
                    .with_unit("{hedge}")
                    .with_description("Second copies of verified reads sent (hedged reads).")
                    .build(),
                hedges_counted: AtomicU64::new(0),
                budget_tokens: meter
                    .u64_gauge("sqlhttp.client.retry_budget.tokens")
                    .with_unit("{token}")
                    .with_description("Tokens left in the client's retry budget.")
                    .build(),
                send_rate: meter
                    .f64_gauge("sqlhttp.client.send_rate")
                    .with_unit("{attempt}/s")
                    .with_description("Attempts per second the adaptive client rate allows.")
                    .build(),
                server,
            }
        }

        pub(super) fn call_ended(
            &self,
            elapsed: Duration,
            sql: &str,
            engine: Option<&str>,
            failure: Option<&ErrorKind>,
        ) {
            let mut attributes = Vec::with_capacity(self.server.len() + 4);
            attributes.extend_from_slice(&self.server);
            if let Some(word) = crate::transport::trace::operation(sql) {
                attributes.push(KeyValue::new("db.operation.name", operation(word)));
            }
            if let Some(name) = engine {
                attributes.push(KeyValue::new("db.system.name", self::engine(name)));
            }
            if let Some(failure) = failure {
                attributes.push(KeyValue::new(
                    "error.type",
                    error_type(failure).into_owned(),
                ));
                if let Some(code) = failure.wire_code() {
                    attributes.push(KeyValue::new("db.response.status_code", code.to_owned()));
                }
            }
            self.duration.record(elapsed.as_secs_f64(), &attributes);
        }

        /// The client's retry state as a call ends, and a refusal by the adaptive rate.
        pub(super) fn state(&self, state: &RetryState, failure: Option<&ErrorKind>) {
            if let Some(tokens) = state.tokens() {
                self.budget_tokens.record(u64::from(tokens), &self.server);
            }
            if let Some(rate) = state.send_rate() {
                self.send_rate.record(rate, &self.server);
            }
            let sent = state.hedges_sent();
            let counted = self.hedges_counted.fetch_max(sent, Ordering::Relaxed);
            if sent > counted {
                self.hedges.add(sent - counted, &self.server);
            }
            if matches!(failure, Some(ErrorKind::ClientRateLimited { .. })) {
                self.rate_refusals.add(1, &self.server);
            }
        }

        pub(super) fn retry(&self, failure: &ErrorKind) {
            // A retry is rare next to a call: its attributes are built as they come.
            let mut attributes = self.server.clone();
            attributes.push(KeyValue::new(
                "error.type",
                error_type(failure).into_owned(),
            ));
            self.retries.add(1, &attributes);
        }
    }
}
