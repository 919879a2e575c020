//! Gives the answers hyper writes on its own (a malformed request head `400`, a head over its
//! size limits `431`, a request target too long `414`) the protocol's JSON error body, and
//! renders the raw responses the server writes before hyper is involved (the connection cap's
//! `503`).
//!
//! [`JsonErrors`] wraps a connection's byte stream: it passes every byte through, except an
//! automatic error head from hyper (recognised by its exact shape: a status hyper answers by
//! itself with its canonical reason, `content-length: 0`, and no header the app's responses
//! carry), which it replaces with a complete JSON response. Looking costs time linear in what is
//! written. Every connection closes lingering: it stops writing, then reads and discards what
//! the client is still sending for a short while, so the client is not reset before it has read
//! the answer (a 1 MB header or a 4 MB body refused with `413` while most of it is still in
//! flight). Knows HTTP/1.1 framing; nothing about routes or the engine.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::protocol::error::{ApiError, ErrorCode};

/// The whole HTTP/1.1 response for `error`, closing the connection.
pub(crate) fn raw_response(error: &ApiError) -> Vec<u8> {
    let status = crate::protocol::error::status_of(error.code);
    let body = error.body();
    let retry_after = if error.code.sends_retry_after() {
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

/// Longest head hyper writes for an automatic error (status line, `content-length: 0`, `date`,
/// perhaps `connection: close`): a candidate is read within this many bytes, so the scan is
/// linear in what is written, whatever the bodies hold.
const MAX_AUTOMATIC_HEAD: usize = 256;

/// Finds hyper's automatic error head at the end of `buf`: its start, its end (after the blank
/// line) and the replacement response. Only a head of exactly hyper's shape matches: `HTTP/1.x NNN
/// <canonical reason>` with a status hyper answers by itself, then only `content-length: 0`,
/// `date` and `connection` lines, each ended by CRLF. Bodies are JSON or fixed text, in which a
/// raw CR LF never appears, and client-supplied head values (request ids) hold neither spaces nor
/// slashes, so nothing a client sends can take that shape.
fn find_automatic_error(buf: &[u8]) -> Option<(usize, usize, Vec<u8>)> {
    // Hyper writes its own error answer last, then closes: only the tail of a write can be one,
    // so each write costs a look at its last few hundred bytes, whatever came before.
    if !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    let tail_start = buf.len().saturating_sub(MAX_AUTOMATIC_HEAD);
    let tail = &buf[tail_start..];
    let mut from = 0;
    while let Some(offset) = tail[from..]
        .windows(PREFIX_LEN)
        .position(|window| window == b"HTTP/1.1 " || window == b"HTTP/1.0 ")
    {
        let start = from + offset;
        from = start + 1;
        if let Some((head_len, error)) = automatic_head(&tail[start..])
            && start + head_len == tail.len()
        {
            return Some((tail_start + start, buf.len(), raw_response(&error)));
        }
    }
    None
}

/// The length of `HTTP/1.x `.
const PREFIX_LEN: usize = 9;

/// The length of the automatic error head `window` starts with, and the error it stands for.
fn automatic_head(window: &[u8]) -> Option<(usize, ApiError)> {
    // Cheapest checks first: most candidates fail at the status or the reason, in a few bytes.
    let status = window.get(9..12)?;
    let error = error_for(status)?;
    let code = std::str::from_utf8(status).ok()?.parse::<u16>().ok()?;
    let reason = axum::http::StatusCode::from_u16(code)
        .ok()?
        .canonical_reason()?;
    let ending = format!(" {reason}\r\n");
    if !window.get(12..)?.starts_with(ending.as_bytes()) {
        return None;
    }
    let mut len = 12 + ending.len();
    for line in window[len..].split_inclusive(|b| *b == b'\n') {
        len += line.len();
        let line = line.strip_suffix(b"\r\n")?;
        if line.is_empty() {
            return Some((len, error));
        }
        let lower = line.to_ascii_lowercase();
        let allowed = lower == b"content-length: 0"
            || lower.starts_with(b"date: ")
            || lower.starts_with(b"connection: ");
        if !allowed || !line.iter().all(|b| (0x20..=0x7e).contains(b)) {
            return None;
        }
    }
    // The window ended before the blank line: not a head of hyper's.
    None
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
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => self.discarded = true,
                Poll::Pending if self.discarded => return Poll::Pending,
                // End of stream, a read error, or an idle peer (nothing read yet): close now.
                Poll::Ready(_) | Poll::Pending => return Poll::Ready(Ok(())),
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
    fn only_hyper_shaped_heads_match_and_bodies_cost_linear_time() {
        // A client's request id once read as a status line inside a 200's head.
        let spliced = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: HTTP/1.1_400_x\r\ncontent-length: 0\r\n\r\n";
        assert!(find_automatic_error(spliced).is_none());
        let mut body = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..100_000 {
            body.extend_from_slice(b"HTTP/1.1 400 ");
        }
        let started = std::time::Instant::now();
        assert!(find_automatic_error(&body).is_none());
        // 1.3 MB of candidates, each dismissed within a few bytes.
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let wrong_reason = b"HTTP/1.1 400 Nope\r\ncontent-length: 0\r\n\r\n";
        assert!(find_automatic_error(wrong_reason).is_none());
        let extra_header = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nx-a: b\r\n\r\n";
        assert!(find_automatic_error(extra_header).is_none());
        let with_connection = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\ndate: Sun, 29 Nov 2026 16:00:00 GMT\r\n\r\n";
        assert!(find_automatic_error(with_connection).is_some());
        // Hyper answers an HTTP/1.0 keep-alive connection in its version.
        let http10 = b"HTTP/1.0 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert!(find_automatic_error(http10).is_some());
        // Only the end of a write is looked at: a head followed by more is not hyper's own.
        let mut followed = with_connection.to_vec();
        followed.extend_from_slice(b"{}");
        assert!(find_automatic_error(&followed).is_none());
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
