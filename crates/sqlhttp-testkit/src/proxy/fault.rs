//! [`Fault`]: what the [`ChaosProxy`](super::ChaosProxy) does with one HTTP request, and the
//! constructors for canned responses.
//!
//! This module only describes faults. It must not know about sockets, tasks or how the proxy
//! carries a fault out.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

/// What the proxy does with one incoming HTTP request.
///
/// Faults are consumed one per request, in the order they were pushed; a request that finds the
/// plan empty is treated as [`Fault::Pass`]. Every exchange is single-use: one request per client
/// connection and one upstream connection per forwarded request, both closed afterwards.
///
/// When a fault forwards the request and the upstream cannot be reached (it is down, or it closes
/// without a complete response; behind a balanced proxy, when every upstream refused the
/// connection), the proxy's response is its own `502 Bad Gateway`
/// (`504 Gateway Timeout` when the upstream does not answer within the proxy's I/O timeout), and
/// the fault then applies to that response.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Forward the request and relay the complete response.
    Pass,
    /// Read the request, then close the client connection without forwarding it: the upstream
    /// never sees the request.
    CloseBeforeForward,
    /// Like [`Fault::CloseBeforeForward`] but abortive: the client connection is reset (TCP `RST`).
    ResetBeforeForward,
    /// Forward the request and read the upstream's complete response (the upstream did the
    /// work), then close the client connection without sending any of it.
    DropAfterForward,
    /// Forward the request, read the complete response, hold it this long, then relay it.
    Delay(Duration),
    /// Forward the request and relay only the first this-many bytes of the response (head
    /// included), then close. A count at or over the response's length relays all of it.
    Truncate(usize),
    /// Answer with this response without forwarding the request. `Content-Length` and
    /// `Connection: close` are the proxy's; those names in `headers` are ignored.
    Respond {
        /// The status to answer with.
        status: StatusCode,
        /// Header fields, in order, as (name, value).
        headers: Vec<(String, String)>,
        /// The response body.
        body: Bytes,
    },
    /// Read the request, then neither forward nor answer: the connection stays open until the
    /// client goes away or the proxy is dropped.
    Stall,
}

impl Fault {
    /// A response with this status, a short plain-text body and no other headers, as a
    /// load balancer or gateway would send (`502`, `503`, `504` ...).
    ///
    /// # Panics
    /// If `status` is not in `100..=999`.
    pub fn status(status: u16) -> Fault {
        let status = valid_status(status);
        Fault::Respond {
            status,
            headers: vec![text_plain()],
            body: Bytes::from(format!(
                "{} {} (injected by sqlhttp-testkit)",
                status.as_str(),
                status.canonical_reason().unwrap_or("")
            )),
        }
    }

    /// A response with this status and a sqlhttp wire-protocol error body
    /// `{"error": {"code": code, "message": message}}`, as `sqlhttpd` would send.
    ///
    /// # Panics
    /// If `status` is not in `100..=999`.
    pub fn error(status: u16, code: &str, message: &str) -> Fault {
        let body = serde_json::json!({ "error": { "code": code, "message": message } });
        Fault::Respond {
            status: valid_status(status),
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: Bytes::from(body.to_string()),
        }
    }

    /// `429 Too Many Requests` with `Retry-After: <retry_after_secs>` and a `RATE_LIMITED`
    /// error body.
    pub fn rate_limited(retry_after_secs: u64) -> Fault {
        Fault::error(
            429,
            "RATE_LIMITED",
            "rate limited (injected by sqlhttp-testkit)",
        )
        .with_header("retry-after", &retry_after_secs.to_string())
    }

    /// `503 Service Unavailable` with `Retry-After: <retry_after_secs>` and an `UNAVAILABLE`
    /// error body.
    pub fn unavailable(retry_after_secs: u64) -> Fault {
        Fault::error(
            503,
            "UNAVAILABLE",
            "unavailable (injected by sqlhttp-testkit)",
        )
        .with_header("retry-after", &retry_after_secs.to_string())
    }

    /// Adds a header field to a [`Fault::Respond`].
    ///
    /// # Panics
    /// If `self` is any other fault: only a canned response has headers.
    #[must_use]
    pub fn with_header(mut self, name: &str, value: &str) -> Fault {
        match &mut self {
            Fault::Respond { headers, .. } => headers.push((name.to_owned(), value.to_owned())),
            other => panic!("with_header applies to Fault::Respond only, not {other:?}"),
        }
        self
    }
}

fn valid_status(status: u16) -> StatusCode {
    StatusCode::from_u16(status)
        .unwrap_or_else(|_| panic!("{status} is not an HTTP status code (100..=999)"))
}

fn text_plain() -> (String, String) {
    (
        "content-type".to_owned(),
        "text/plain; charset=utf-8".to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(fault: Fault) -> (u16, Vec<(String, String)>, serde_json::Value) {
        match fault {
            Fault::Respond {
                status,
                headers,
                body,
            } => (
                status.as_u16(),
                headers,
                serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
            ),
            other => panic!("not a response: {other:?}"),
        }
    }

    #[test]
    fn rate_limited_carries_retry_after_and_wire_error() {
        let (status, headers, body) = parts(Fault::rate_limited(2));
        assert_eq!(status, 429);
        assert!(headers.contains(&("retry-after".to_owned(), "2".to_owned())));
        assert_eq!(body["error"]["code"], "RATE_LIMITED");
    }

    #[test]
    fn unavailable_is_503_with_retry_after() {
        let (status, headers, body) = parts(Fault::unavailable(7));
        assert_eq!(status, 503);
        assert!(headers.contains(&("retry-after".to_owned(), "7".to_owned())));
        assert_eq!(body["error"]["code"], "UNAVAILABLE");
    }

    #[test]
    fn error_escapes_its_message() {
        let (_, _, body) = parts(Fault::error(400, "SQL_ERROR", "near \"x\": syntax error"));
        assert_eq!(body["error"]["message"], "near \"x\": syntax error");
    }

    #[test]
    fn status_is_plain_text() {
        let (status, headers, body) = parts(Fault::status(502).with_header("x-a", "b"));
        assert_eq!(status, 502);
        assert_eq!(headers[0].1, "text/plain; charset=utf-8");
        assert_eq!(headers[1], ("x-a".to_owned(), "b".to_owned()));
        assert_eq!(body, serde_json::Value::Null);
    }

    #[test]
    #[should_panic(expected = "not an HTTP status code")]
    fn status_out_of_range_panics() {
        let _ = Fault::status(42);
    }

    #[test]
    #[should_panic(expected = "Fault::Respond only")]
    fn with_header_on_other_fault_panics() {
        let _ = Fault::Pass.with_header("a", "b");
    }
}
