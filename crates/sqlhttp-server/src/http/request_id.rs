//! Request ids: every response carries `X-Request-Id`, the client's own when it sent a sane one
//! (1 to 128 letters, digits, `-`, `_`, `.` or `:`, in one header), else one generated here (32 hex digits,
//! 128 random bits). The id is in the request's extensions, the request's log line and span.
//!
//! Knows one header; nothing about routes, credentials or the engine.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The header, in requests and responses.
pub(crate) const X_REQUEST_ID: HeaderName =
    HeaderName::from_static(sqlhttp_protocol::header::REQUEST_ID);

/// Longest client id kept; a longer one is replaced.
pub(crate) const MAX_LEN: usize = sqlhttp_protocol::header::MAX_REQUEST_ID_BYTES;

/// One request's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestId(HeaderValue);

impl RequestId {
    /// The client's id when it sent one sane `X-Request-Id`, else a new one.
    pub(crate) fn from_client_or_new(headers: &HeaderMap) -> RequestId {
        let mut sent = headers.get_all(X_REQUEST_ID).iter();
        match (sent.next(), sent.next()) {
            (Some(value), None) if is_sane(value.as_bytes()) => RequestId(value.clone()),
            _ => RequestId::generate(),
        }
    }

    /// A fresh id: 128 random bits in hex.
    pub(crate) fn generate() -> RequestId {
        let hex = crate::hex::digits::<32>(rand::random());
        RequestId(HeaderValue::from_bytes(&hex).expect("hex is a header value"))
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only visible ASCII gets in.
        self.0.to_str().unwrap_or("-")
    }

    pub(crate) fn header_value(&self) -> HeaderValue {
        self.0.clone()
    }
}

/// 1 to [`MAX_LEN`] characters of a token's alphabet (ASCII letters, digits, `-`, `_`, `.`,
/// `:`): safe to log and to echo in a response head, where nothing in it can read as HTTP
/// framing, a log field or a status line (`HTTP/1.1 400` has a `/` and a space).
pub(crate) fn is_sane(bytes: &[u8]) -> bool {
    !bytes.is_empty()
        && bytes.len() <= MAX_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&[u8]]) -> RequestId {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(X_REQUEST_ID, HeaderValue::from_bytes(value).unwrap());
        }
        RequestId::from_client_or_new(&headers)
    }

    fn generated(id: &RequestId) -> bool {
        id.as_str().len() == 32 && id.as_str().bytes().all(|b| b.is_ascii_hexdigit())
    }

    #[test]
    fn a_sane_client_id_is_kept() {
        assert_eq!(with(&[b"abc-123"]).as_str(), "abc-123");
        let traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(with(&[traceparent]).as_str().as_bytes(), traceparent);
        assert_eq!(with(&[b"req_1.2:3"]).as_str(), "req_1.2:3");
        let long = [b'x'; MAX_LEN];
        assert_eq!(with(&[&long]).as_str().len(), MAX_LEN);
    }

    #[test]
    fn anything_else_gets_a_fresh_id() {
        let too_long = [b'x'; MAX_LEN + 1];
        for values in [
            &[][..],
            &[&b""[..]][..],
            &[&b"has space"[..]][..],
            &[&b"tab\there"[..]][..],
            &[&b"caf\xc3\xa9"[..]][..],
            &[&b"HTTP/1.1_400_x"[..]][..],
            &[&b"a\"b"[..]][..],
            &[&b"x=1"[..]][..],
            &[&too_long[..]][..],
            &[&b"one"[..], &b"two"[..]][..],
        ] {
            assert!(generated(&with(values)), "{values:?}");
        }
        assert_ne!(RequestId::generate(), RequestId::generate());
    }
}
