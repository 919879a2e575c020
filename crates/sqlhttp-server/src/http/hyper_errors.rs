//! Gives the answers hyper writes on its own (a malformed request head `400`, a head over its
//! size limits `431`, a request target too long `414`) the protocol's JSON error body, and
//! renders the raw responses the server writes before hyper is involved (the connection cap's
//! `503`).
//!
//! [`JsonErrors`] wraps a connection's byte stream: it passes every byte through, except an
//! automatic error head from hyper (recognised by its status and its lack of a
//! `content-type`, which every response of the app has), which it replaces with a complete JSON
//! response. Every connection closes lingering: it stops writing, then reads and discards what
//! the client is still sending for a short while, so the client is not reset before it has read
//! the answer (a 1 MB header or a 4 MB body refused with `413` while most of it is still in
//! flight). Knows HTTP/1.1 framing; nothing about routes or the engine.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::api_error::{ApiError, ErrorCode};

/// The whole HTTP/1.1 response for `error`, closing the connection.
pub(crate) fn raw_response(error: &ApiError) -> Vec<u8> {
    let status = error.code.status();
    let body = error.body();
    let retry_after = if error.code == ErrorCode::Unavailable {
        "retry-after: 1\r\n"
    } else {
        ""
    };
    // No request was parsed to take an id from: every answer still carries one.
    let request_id = crate::http::request_id::RequestId::generate();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry_after}x-request-id: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
        request_id.as_str()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// The protocol error standing for hyper's automatic answer with this status.
fn error_for(status: &[u8]) -> Option<ApiError> {
    let (code, message) = match status {
        b"400" => (
            ErrorCode::BadRequest,
            "the request is not valid HTTP/1.1 (malformed request line or headers)",
        ),
        b"414" => (ErrorCode::UriTooLong, "the request target is too long"),
        b"431" => (
            ErrorCode::HeadersTooLarge,
            "the request's headers are too large or too many",
        ),
        _ => return None,
    };
    Some(ApiError::new(code, message))
}

/// Finds hyper's automatic error head in `buf`: its start, its end (after the blank line) and
/// the replacement response.
fn find_automatic_error(buf: &[u8]) -> Option<(usize, usize, Vec<u8>)> {
    const PREFIX: &[u8] = b"HTTP/1.";
    let mut from = 0;
    while let Some(offset) = find(&buf[from..], PREFIX) {
        let start = from + offset;
        from = start + 1;
        // "HTTP/1.x NNN "
        let Some(status) = buf.get(start + 9..start + 12) else {
            continue;
        };
        let Some(error) = error_for(status) else {
            continue;
        };
        let Some(head_len) = find(&buf[start..], b"\r\n\r\n") else {
            continue;
        };
        let end = start + head_len + 4;
        let head = buf[start..end].to_ascii_lowercase();
        if find(&head, b"content-type:").is_none()
            && find(&head, b"content-length: 0\r\n").is_some()
        {
            return Some((start, end, raw_response(&error)));
        }
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// How long a closing connection keeps reading what the client still sends.
const LINGER: Duration = Duration::from_secs(2);

/// A connection stream that turns hyper's automatic error answers into JSON ones.
#[derive(Debug)]
pub(crate) struct JsonErrors<S> {
    inner: S,
    /// Bytes accepted from hyper but not yet written to `inner`.
    pending: Vec<u8>,
    /// Set once the write half is shut down and the linger has started.
    linger: Option<Pin<Box<Sleep>>>,
    /// The client was still sending when the connection closed.
    discarded: bool,
}

impl<S> JsonErrors<S> {
    pub(crate) fn new(inner: S) -> JsonErrors<S> {
        JsonErrors {
            inner,
            pending: Vec::new(),
            linger: None,
            discarded: false,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> JsonErrors<S> {
    /// Shuts the write half, then, if the client is still sending, discards its input until it
    /// closes or the linger ends. An idle connection (nothing in flight) closes at once.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.linger.is_none() {
            ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
            self.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        let mut discard = [0_u8; 8192];
        loop {
            if let Some(linger) = self.linger.as_mut()
                && linger.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut discard);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => self.discarded = true,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending if self.discarded => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let written = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..written);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_drain(cx))?;
        match find_automatic_error(buf) {
            Some((start, end, replacement)) => {
                let this = &mut *self;
                this.pending.extend_from_slice(&buf[..start]);
                this.pending.extend_from_slice(&replacement);
                this.pending.extend_from_slice(&buf[end..]);
                // Accepted whole; what the inner stream cannot take now goes out on flush.
                let _ = this.poll_drain(cx)?;
                Poll::Ready(Ok(buf.len()))
            }
            None => Pin::new(&mut self.inner).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        self.poll_linger(cx)
    }

    // Not vectored: hyper then writes each head in one contiguous buffer, where it can be
    // recognised.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_heads_are_replaced_and_app_responses_pass() {
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sun, 29 Nov 2026 16:00:00 GMT\r\n\r\n";
        let (start, end, replacement) = find_automatic_error(hyper_431).unwrap();
        assert_eq!((start, end), (0, hyper_431.len()));
        let text = String::from_utf8(replacement).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
        assert!(text.contains("content-type: application/json"), "{text}");
        assert!(text.ends_with(r#""code":"HEADERS_TOO_LARGE","message":"the request's headers are too large or too many"}}"#), "{text}");

        let mut after_a_response =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                .to_vec();
        let offset = after_a_response.len();
        after_a_response
            .extend_from_slice(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        let (start, _, replacement) = find_automatic_error(&after_a_response).unwrap();
        assert_eq!(start, offset);
        assert!(
            String::from_utf8(replacement)
                .unwrap()
                .contains("BAD_REQUEST")
        );

        let app_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert!(find_automatic_error(app_400).is_none());
        assert!(find_automatic_error(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
    }

    #[test]
    fn raw_responses_are_complete() {
        let text = String::from_utf8(raw_response(&ApiError::unavailable("full"))).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 Service Unavailable"));
        assert!(head.contains("retry-after: 1"));
        assert!(head.contains("\r\nx-request-id: "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert_eq!(body, r#"{"error":{"code":"UNAVAILABLE","message":"full"}}"#);
    }
}
