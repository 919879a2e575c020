//! One trace from the application's call through every retry into the server: the SDK's call
//! and attempt spans and sqlhttpd's own spans, exported through a real OpenTelemetry pipeline
//! (`tracing-opentelemetry` over the SDK's `InMemorySpanExporter`, the global
//! `TraceContextPropagator`), and the SDK's metrics through an `InMemoryMetricExporter`.
//!
//! A binary of its own with a single test: it installs the process's global subscriber,
//! propagator and meter provider, and the in-process server (`sqlhttp_testkit::TestServer`, on
//! this test's runtime) reports its spans to the same subscriber. The chaos proxy between the
//! two drops the first answer of a read (the server ran it), and the SDK sends it again.

use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use sqlhttp::RetryPolicy;
use sqlhttp_testkit::{Fault, TestServer};
use tracing_subscriber::layer::SubscriberExt;

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> Option<String> {
    attribute(span, key).map(Value::to_string)
}

/// The spans of one trace: the SDK's call, its attempts, and the spans under each attempt.
struct Trace {
    spans: Vec<SpanData>,
}

impl Trace {
    fn named(&self, name: &str) -> Vec<&SpanData> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }

    fn children(&self, parent: SpanId) -> Vec<&SpanData> {
        self.spans
            .iter()
            .filter(|s| s.parent_span_id == parent)
            .collect()
    }

    fn in_trace(&self, trace: TraceId) -> usize {
        self.spans
            .iter()
            .filter(|s| s.span_context.trace_id() == trace)
            .count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_retried_through_a_lost_answer_is_one_trace_into_the_server() {
    // The pipeline: spans through tracing-opentelemetry to the in-memory exporter, the W3C
    // propagator the SDK injects with, and metrics to an in-memory exporter.
    let spans = InMemorySpanExporter::default();
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let subscriber = tracing_subscriber::registry().with(
        tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("integration-tests")),
    );
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let metrics = InMemoryMetricExporter::default();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics.clone()).build())
        .build();
    opentelemetry::global::set_meter_provider(meter_provider.clone());

    let server = TestServer::start().await;
    let proxy = server.proxy().await;
    let client = server
        .proxied_client_builder(&proxy)
        .retry(
            RetryPolicy::new()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(5))
                .with_max_backoff(Duration::from_millis(10)),
        )
        .build()
        .unwrap();
    client
        .execute("CREATE TABLE traced (id INTEGER PRIMARY KEY, name TEXT)")
        .await
        .unwrap();
    client
        .execute("INSERT INTO traced (id, name) VALUES (1, 'one')")
        .await
        .unwrap();
    spans.reset();

    // The server runs the read; its answer is lost on the way back; the SDK sends it again.
    proxy.push(Fault::DropAfterForward);
    let table = client
        .query_table("SELECT id, name FROM traced WHERE id = ?")
        .bind(1)
        .await
        .unwrap();
    assert_eq!(table.len(), 1);
    assert_eq!(table.stats().total_attempts, 2);
    assert_eq!(proxy.forwarded(), 4, "both attempts reached the server");

    // The server's spans end as its answers are written: wait for them (a second at most).
    let trace = {
        let mut waited = 0;
        loop {
            let finished = spans.get_finished_spans().unwrap();
            let calls = finished
                .iter()
                .filter(|s| s.name == "SELECT traced")
                .count();
            let attempts: Vec<SpanId> = finished
                .iter()
                .filter(|s| s.name == "sqlhttp.attempt")
                .map(|s| s.span_context.span_id())
                .collect();
            let served = attempts
                .iter()
                .all(|id| finished.iter().any(|s| s.parent_span_id == *id));
            if (calls == 1 && attempts.len() == 2 && served) || waited >= 100 {
                break Trace { spans: finished };
            }
            waited += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };

    // One call span, CLIENT, by the database conventions.
    let calls = trace.named("SELECT traced");
    assert_eq!(calls.len(), 1, "one call span: {:?}", names(&trace));
    let call = calls[0];
    assert_eq!(call.span_kind, SpanKind::Client);
    assert_eq!(text(call, "db.system.name").as_deref(), Some("sqlite"));
    assert_eq!(text(call, "db.operation.name").as_deref(), Some("SELECT"));
    assert_eq!(
        text(call, "db.query.summary").as_deref(),
        Some("SELECT traced")
    );
    assert_eq!(
        text(call, "db.query.text"),
        None,
        "the statement's text only when the application opts in"
    );
    assert_eq!(
        text(call, "server.address").as_deref(),
        Some("127.0.0.1"),
        "{:?}",
        call.attributes
    );
    assert_eq!(
        attribute(call, "server.port"),
        Some(&Value::I64(i64::from(proxy.addr().port())))
    );
    assert_eq!(attribute(call, "error.type"), None);
    // Nowhere in the SDK's spans (attributes, or events such as its debug ones, which the layer
    // exports with their span) is the statement's text, nor the bound value.
    for span in trace
        .spans
        .iter()
        .filter(|s| s.name == "SELECT traced" || s.name == "sqlhttp.attempt")
    {
        let events = span.events.iter().flat_map(|event| {
            std::iter::once(event.name.to_string())
                .chain(event.attributes.iter().map(|kv| kv.value.to_string()))
        });
        for text in span
            .attributes
            .iter()
            .map(|kv| kv.value.to_string())
            .chain(events)
        {
            assert!(
                !text.contains("WHERE id") && !text.contains("traced WHERE"),
                "the statement's text in {}: {text}",
                span.name
            );
        }
    }

    // Two attempt children: the first lost (a connection failure, retried), the second served.
    let mut attempts = trace.children(call.span_context.span_id());
    attempts.sort_by_key(|s| s.start_time);
    assert_eq!(attempts.len(), 2, "{:?}", names(&trace));
    for (n, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt.name, "sqlhttp.attempt");
        assert_eq!(attempt.span_kind, SpanKind::Client);
        assert_eq!(
            attribute(attempt, "sqlhttp.attempt"),
            Some(&Value::I64(n as i64 + 1))
        );
        assert_eq!(
            text(attempt, "sqlhttp.retry.class").as_deref(),
            Some("read")
        );
        assert_eq!(
            attribute(attempt, "sqlhttp.idempotency_key.sent"),
            Some(&Value::Bool(false)),
            "a read carries no key"
        );
    }
    let (lost, served) = (attempts[0], attempts[1]);
    assert_eq!(text(lost, "error.type").as_deref(), Some("connection"));
    assert_eq!(
        text(lost, "sqlhttp.retry.decision").as_deref(),
        Some("retried")
    );
    assert_eq!(attribute(served, "error.type"), None);
    assert!(
        attribute(served, "sqlhttp.attempt.wait_ms").is_some(),
        "the wait before the second attempt"
    );
    assert_eq!(
        attribute(served, "http.request.resend_count"),
        Some(&Value::I64(1))
    );
    assert!(
        text(served, "sqlhttp.request_id").is_some_and(|id| !id.is_empty()),
        "the server's request id: {:?}",
        served.attributes
    );

    // The server's spans: in the same trace, each under the attempt that reached it (the
    // first's answer was lost after the server ran it).
    let trace_id = call.span_context.trace_id();
    for attempt in [lost, served] {
        let server_spans = trace.children(attempt.span_context.span_id());
        assert!(
            !server_spans.is_empty(),
            "no server span under attempt {:?}: {:?}",
            attribute(attempt, "sqlhttp.attempt"),
            names(&trace)
        );
        for span in server_spans {
            assert_eq!(span.span_context.trace_id(), trace_id);
            assert!(
                span.parent_span_is_remote,
                "{} continues the SDK's trace from its traceparent",
                span.name
            );
        }
    }
    assert!(trace.in_trace(trace_id) > 3, "{:?}", names(&trace));

    // The metrics: one call's duration, two attempts, one retry after a connection failure.
    meter_provider.force_flush().unwrap();
    let finished = metrics.get_finished_metrics().unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for resource in &finished {
        for scope in resource.scope_metrics() {
            for metric in scope.metrics() {
                let (count, attributes): (u64, Vec<KeyValue>) = match metric.data() {
                    AggregatedMetrics::F64(MetricData::Histogram(histogram)) => histogram
                        .data_points()
                        .filter(|p| {
                            p.attributes().any(|kv| {
                                kv.key.as_str() == "db.operation.name"
                                    && kv.value.as_str() == "SELECT"
                            })
                        })
                        .map(|p| (p.count(), p.attributes().cloned().collect()))
                        .fold((0, Vec::new()), |(n, _), (c, a)| (n + c, a)),
                    AggregatedMetrics::U64(MetricData::Gauge(gauge)) => gauge
                        .data_points()
                        .map(|p| (p.value(), p.attributes().cloned().collect()))
                        .last()
                        .unwrap_or_default(),
                    AggregatedMetrics::U64(MetricData::Sum(sum)) => sum
                        .data_points()
                        .map(|p| (p.value(), p.attributes().cloned().collect()))
                        .fold(
                            (0, Vec::new()),
                            |(n, mut all), (v, a): (u64, Vec<KeyValue>)| {
                                all.extend(a);
                                (n + v, all)
                            },
                        ),
                    _ => continue,
                };
                seen.insert(metric.name().to_owned(), (count, attributes));
            }
        }
    }
    let (calls, attributes) = &seen["db.client.operation.duration"];
    assert_eq!(*calls, 1, "one SELECT call: {seen:?}");
    assert!(
        attributes
            .iter()
            .any(|kv| kv.key.as_str() == "db.system.name" && kv.value.as_str() == "sqlite"),
        "{attributes:?}"
    );
    // The CREATE and INSERT were one attempt each, the read two.
    assert_eq!(seen["sqlhttp.client.attempts"].0, 4, "{seen:?}");
    let (retries, attributes) = &seen["sqlhttp.client.retries"];
    assert_eq!(*retries, 1);
    assert!(
        attributes
            .iter()
            .any(|kv| kv.key.as_str() == "error.type" && kv.value.as_str() == "connection"),
        "{attributes:?}"
    );
    assert!(
        !seen.contains_key("sqlhttp.client.retry_budget.refusals")
            || seen["sqlhttp.client.retry_budget.refusals"].0 == 0
    );
    // The budget's state as the last call ended, as the client shows it (the retry cost it).
    let tokens = client.retry_state().tokens().unwrap();
    assert!(tokens < client.retry_state().capacity().unwrap());
    assert_eq!(
        seen["sqlhttp.client.retry_budget.tokens"].0,
        u64::from(tokens),
        "{seen:?}"
    );
}

fn names(trace: &Trace) -> Vec<(String, SpanId, SpanId)> {
    trace
        .spans
        .iter()
        .map(|s| {
            (
                s.name.to_string(),
                s.span_context.span_id(),
                s.parent_span_id,
            )
        })
        .collect()
}
