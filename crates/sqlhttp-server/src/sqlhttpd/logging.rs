//! Logging to stderr as `RUST_LOG` says, and the export of spans over OTLP/HTTP when asked.
//!
//! Nothing here knows the flags or the server: [`init_logging`] takes where spans go.

use std::io::IsTerminal as _;

/// Logs to stderr as `RUST_LOG` says (default `info`); with `otlp` (an endpoint, or `None` for
/// the standard environment's), also exports the spans at `info` and above over OTLP/HTTP in
/// batches from a thread of their own. Returns the provider to flush at exit.
pub(crate) fn init_logging(
    otlp: Option<Option<String>>,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, String> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let provider = match otlp {
        None => None,
        Some(endpoint) => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(endpoint) = endpoint {
                exporter = exporter.with_endpoint(endpoint);
            }
            let exporter = exporter
                .build()
                .map_err(|e| format!("cannot export spans over OTLP: {e}"))?;
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name("sqlhttpd")
                .build();
            Some(
                opentelemetry_sdk::trace::SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
    };
    let spans = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("sqlhttpd"))
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    tracing_subscriber::registry().with(log).with(spans).init();
    Ok(provider)
}
