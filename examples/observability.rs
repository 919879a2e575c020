//! The SDK's traces and metrics sent to an OpenTelemetry collector over OTLP/HTTP: the wiring an
//! application does once at start-up (a tracer provider with an OTLP span exporter behind a
//! `tracing-opentelemetry` layer, the W3C propagator, a meter provider with an OTLP metric
//! exporter), then a few calls whose spans (`SELECT books`, its `sqlhttp.attempt`s, the server's
//! spans under each) and `db.client.operation.duration` arrive at the collector as one trace.
//!
//! ```text
//! # a collector (or Jaeger, Tempo, ...) listening for OTLP/HTTP on 4318:
//! docker run --rm -p 4318:4318 -p 16686:16686 jaegertracing/jaeger:2.5.0
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 cargo run --example observability
//! SQLHTTP_URL=http://127.0.0.1:8080 cargo run --example observability   # a server of yours
//! ```
//! Without `SQLHTTP_URL` it starts an embedded sqlhttpd (in-memory SQLite), whose spans join the
//! same trace. Without a collector the exporters report that they cannot send, and the example
//! still runs. It works in a table of its own, dropped at the end.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sqlhttp::Client;
use sqlhttp_server::{Config, Server, ServerHandle};
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("observability failed: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    // Once, at start-up, before any client is built (a client takes its meter when it is built).
    // The exporters read OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318).
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()?;
    let tracer_provider = SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .build();
    let metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()?;
    let meter_provider = SdkMeterProvider::builder()
        .with_periodic_exporter(metrics)
        .build();
    opentelemetry::global::set_meter_provider(meter_provider.clone());
    // Every attempt carries `traceparent`/`tracestate` through the global propagator.
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("observability")));
    tracing::subscriber::set_global_default(subscriber)?;

    let (url, _server): (String, Option<ServerHandle>) = match std::env::var("SQLHTTP_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let config = Config {
                listen: "127.0.0.1:0".parse()?,
                ..Config::default()
            };
            let server = Server::bind(config).await?.spawn();
            (server.url(), Some(server))
        }
    };
    let client = Client::builder(&url).build()?;

    // The application's own span: the SDK's call spans are its children.
    let request = tracing::info_span!("list_books");
    async {
        let table = format!(
            "observability_books_{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis()
        );
        client
            .execute(format!(
                "CREATE TABLE {table} (id INTEGER PRIMARY KEY, title TEXT)"
            ))
            .await?;
        client
            .execute(format!("INSERT INTO {table} (title) VALUES (?)"))
            .bind("Dune")
            .await?;
        let books = client
            .query_table(format!("SELECT id, title FROM {table}"))
            .await?;
        let stats = books.stats();
        println!(
            "{} book(s); server time {:?}, {:?} rows read, {} attempt(s)",
            books.len(),
            stats.duration,
            stats.rows_read,
            stats.total_attempts
        );
        client.execute(format!("DROP TABLE {table}")).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .instrument(request)
    .await?;

    // Send what is buffered before the process exits.
    let flushed = tracer_provider
        .force_flush()
        .and(meter_provider.force_flush());
    if let Err(err) = flushed {
        eprintln!("the collector did not take the spans and metrics: {err}");
    }
    Ok(())
}
