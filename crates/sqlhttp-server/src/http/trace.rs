//! A request's place in its caller's trace: the W3C Trace Context it carries (`traceparent`,
//! `tracestate`), read with OpenTelemetry's own propagator, made the parent of the request's
//! span; the trace and span ids its log line names; the `respond` span over the sending of its
//! body; and its `Server-Timing` and `Sqlhttp-Engine` headers.
//!
//! A malformed or repeated `traceparent` is ignored (the request starts a trace of its own),
//! never an error; a value over [`MAX_TRACE_HEADER_BYTES`] is ignored before it is parsed.
//! Nothing here runs for a request whose span no subscriber wants but one header lookup.
//!
//! Knows HTTP headers, `tracing` and OpenTelemetry's context, and which engine serves (for its
//! header's value); nothing about engines' work or bodies' contents.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use sqlhttp_protocol::header::{
    self, MAX_TRACE_HEADER_BYTES, SERVER_TIMING_DB, SERVER_TIMING_QUEUE, SERVER_TIMING_TOTAL,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::engine::Backend;
use crate::protocol::result;

/// `Server-Timing`.
pub(crate) const SERVER_TIMING: HeaderName = HeaderName::from_static(header::SERVER_TIMING);
/// `Sqlhttp-Engine`.
pub(crate) const ENGINE: HeaderName = HeaderName::from_static(header::ENGINE);

/// `Sqlhttp-Engine`'s value for `backend`.
pub(crate) fn engine(backend: &Backend) -> HeaderValue {
    HeaderValue::from_static(match backend {
        Backend::Sqlite(_) => header::ENGINE_SQLITE,
        #[cfg(feature = "postgres")]
        Backend::Postgres(_) => header::ENGINE_POSTGRESQL,
    })
}

/// The two headers, bounded, as the propagator reads them.
struct Carrier<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            header::TRACEPARENT => Some(self.traceparent),
            header::TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![header::TRACEPARENT, header::TRACESTATE]
    }
}

/// The one value of header `name` within the bound, as text; `None` when absent, repeated,
/// too long or not visible ASCII.
fn one_bounded<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() || value.len() > MAX_TRACE_HEADER_BYTES {
        return None;
    }
    value.to_str().ok()
}

/// The caller's context, when the request carries a well-formed `traceparent`.
pub(crate) fn incoming(headers: &HeaderMap) -> Option<Context> {
    let traceparent = one_bounded(headers, header::TRACEPARENT)?;
    let carrier = Carrier {
        traceparent,
        tracestate: one_bounded(headers, header::TRACESTATE),
    };
    let context = TraceContextPropagator::new().extract(&carrier);
    context.span().span_context().is_valid().then_some(context)
}

/// Makes the caller's context (from `headers`) the parent of `span`, the request's; returns
/// the caller's span context. Nothing is read when no subscriber wants `span`.
pub(crate) fn continue_trace(span: &tracing::Span, headers: &HeaderMap) -> Option<SpanContext> {
    if span.is_disabled() {
        return None;
    }
    let context = incoming(headers)?;
    let caller = context.span().span_context().clone();
    // Fails only once the span has started (it has not) or without an OpenTelemetry layer,
    // where the caller's ids are still logged.
    let _ = span.set_parent(context);
    Some(caller)
}

/// The trace and span ids the request's log line names: its own span's when an OpenTelemetry
/// layer records it, else the caller's, when it sent a context.
pub(crate) fn ids(span: &tracing::Span, caller: Option<&SpanContext>) -> Option<(String, String)> {
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    let own = context.span();
    let own = own.span_context();
    let chosen = if own.is_valid() { Some(own) } else { caller }?;
    Some((chosen.trace_id().to_string(), chosen.span_id().to_string()))
}

/// `Server-Timing`'s value: `queue;dur=0.120, db;dur=1.305, total;dur=1.611` (milliseconds,
/// microsecond precision).
pub(crate) fn server_timing(queue: Duration, db: Duration, total: Duration) -> HeaderValue {
    let mut value = Vec::with_capacity(64);
    for (index, (name, took)) in [
        (SERVER_TIMING_QUEUE, queue),
        (SERVER_TIMING_DB, db),
        (SERVER_TIMING_TOTAL, total),
    ]
    .into_iter()
    .enumerate()
    {
        if index > 0 {
            value.extend_from_slice(b", ");
        }
        value.extend_from_slice(name.as_bytes());
        value.extend_from_slice(b";dur=");
        result::millis(&mut value, took);
    }
    // Names and digits only: always a valid header value.
    HeaderValue::from_maybe_shared(Bytes::from(value)).unwrap_or(HeaderValue::from_static(""))
}

/// A response body sent under a `respond` span (the span lives until the body is done or
/// dropped).
pub(crate) struct Traced {
    inner: Body,
    span: tracing::Span,
}

impl Traced {
    /// `inner`, sent under a `respond` child of `parent`.
    pub(crate) fn new(inner: Body, parent: &tracing::Span) -> Traced {
        Traced {
            inner,
            span: tracing::info_span!(parent: parent, "respond"),
        }
    }
}

impl HttpBody for Traced {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let _entered = this.span.enter();
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_read_and_anything_else_ignored() {
        let context =
            incoming(&headers(&[("traceparent", PARENT), ("tracestate", "a=1")])).expect("read");
        let span = context.span();
        let caller = span.span_context();
        assert_eq!(
            caller.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(caller.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(caller.trace_state().get("a"), Some("1"));
        let long = format!("{PARENT}{}", "0".repeat(MAX_TRACE_HEADER_BYTES));
        for bad in [
            vec![("traceparent", "garbage")],
            vec![(
                "traceparent",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            )],
            vec![("traceparent", long.as_str())],
            vec![("traceparent", PARENT), ("traceparent", PARENT)],
            vec![],
        ] {
            assert!(incoming(&headers(&bad)).is_none(), "{bad:?}");
        }
        // A tracestate past the bound is dropped; the traceparent still counts.
        let state = format!("a={}", "x".repeat(MAX_TRACE_HEADER_BYTES));
        let context =
            incoming(&headers(&[("traceparent", PARENT), ("tracestate", &state)])).expect("read");
        assert_eq!(context.span().span_context().trace_state().get("a"), None);
    }

    #[test]
    fn server_timing_is_milliseconds_with_microseconds() {
        let value = server_timing(
            Duration::from_micros(120),
            Duration::from_micros(1305),
            Duration::from_micros(1_611_007),
        );
        assert_eq!(
            value.to_str().unwrap(),
            "queue;dur=0.120, db;dur=1.305, total;dur=1611.007"
        );
    }
}
