//! sqlhttpd continues its caller's trace, in process: a test that installs a global `tracing`
//! subscriber with a `tracing_opentelemetry` layer over the OpenTelemetry SDK's in-memory
//! exporter (a real pipeline) sees the server's spans (`request` under the caller's span, and
//! `admission`, `queue`, `engine`, `respond` under it) in the caller's trace, and the request's
//! log line names the trace and span. A malformed or oversized `traceparent` is ignored: 200,
//! and a trace of the server's own.
//!
//! Its own test binary: it owns the process's global subscriber. Reads no environment.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use sqlhttp_testkit::TestServer;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

/// The log lines written, for the `request` line's fields.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Installed {
    exporter: InMemorySpanExporter,
    lines: Lines,
}

/// Installs the global subscriber once: OpenTelemetry's layer over the in-memory exporter,
/// and a plain-text log of the server's lines.
fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("trace-test")))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
            );
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        Installed { exporter, lines }
    })
}

/// The finished spans of `trace`, once its `respond` span (the last to end) is among them.
async fn spans_of(trace: TraceId) -> Vec<SpanData> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let spans: Vec<SpanData> = installed()
            .exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|span| span.span_context.trace_id() == trace)
            .collect();
        if spans.iter().any(|span| span.name == "respond")
            && spans.iter().any(|span| span.name == "request")
        {
            return spans;
        }
        assert!(
            Instant::now() < until,
            "no finished request in trace {trace}: {spans:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn post(server: &TestServer, headers: &[(&str, &str)], sql: &str) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", server.url()))
        .header("content-type", "application/json")
        .body(serde_json::json!({ "sql": sql }).to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn the_server_s_spans_continue_the_caller_s_trace() {
    installed();
    let server = TestServer::with_config(sqlhttp_server::Config::default()).await;
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let answer = post(
        &server,
        &[
            ("traceparent", &traceparent),
            ("tracestate", "vendor=1"),
            ("x-request-id", "traced-1"),
        ],
        "SELECT 1 AS one",
    )
    .await;
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();

    let spans = spans_of(TraceId::from_hex(TRACE).unwrap()).await;
    let named = |name: &str| {
        spans
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no {name} span: {spans:?}"))
    };
    let request = named("request");
    assert_eq!(request.parent_span_id, SpanId::from_hex(CALLER).unwrap());
    assert!(request.parent_span_is_remote, "the caller's span is remote");
    assert_eq!(request.span_context.trace_state().get("vendor"), Some("1"));
    let own = request.span_context.span_id();
    for child in ["admission", "queue", "engine", "respond"] {
        assert_eq!(
            named(child).parent_span_id,
            own,
            "{child} is the request's child"
        );
    }

    // The request's log line names the trace and the server's span.
    let lines = String::from_utf8(installed().lines.0.lock().unwrap().clone()).unwrap();
    let line = lines
        .lines()
        .find(|line| {
            line.contains("request_id=\"traced-1\"") || line.contains("request_id=traced-1")
        })
        .unwrap_or_else(|| panic!("no request line: {lines}"));
    assert!(line.contains(TRACE), "{line}");
    assert!(line.contains(&own.to_string()), "{line}");
}

#[tokio::test]
async fn a_malformed_or_huge_traceparent_is_ignored() {
    installed();
    let server = TestServer::with_config(sqlhttp_server::Config::default()).await;
    let malformed = "0af7651916cd43dd8448eb211c80319c";
    for traceparent in [
        format!("00-{malformed}-zzzzzzzzzzzzzzzz-01"),
        format!("00-{malformed}-0000000000000000-01"),
        format!("00-{malformed}-{CALLER}-01-extra"),
        "not a traceparent".to_owned(),
    ] {
        let answer = post(&server, &[("traceparent", &traceparent)], "SELECT 1").await;
        assert_eq!(answer.status(), 200, "{traceparent}");
        answer.bytes().await.unwrap();
    }
    // A later version's traceparent may carry more fields, which a reader skips: one within
    // the bound continues its trace, one past it (64 KiB) is not even parsed.
    let within = "1a2b3c4d5e6f708192a3b4c5d6e7f801";
    let past = "2a2b3c4d5e6f708192a3b4c5d6e7f802";
    for (trace, padding) in [(within, 16), (past, 64 * 1024)] {
        let traceparent = format!("cc-{trace}-{CALLER}-01-{}", "0".repeat(padding));
        let answer = post(&server, &[("traceparent", &traceparent)], "SELECT 1").await;
        assert_eq!(answer.status(), 200, "{trace}");
        answer.bytes().await.unwrap();
    }
    spans_of(TraceId::from_hex(within).unwrap()).await;
    let finished = installed().exporter.get_finished_spans().unwrap();
    for trace in [malformed, past] {
        assert!(
            finished
                .iter()
                .all(|span| span.span_context.trace_id().to_string() != trace),
            "the context of trace {trace} was taken"
        );
    }
}
