//! Just enough HTTP/1.1 for a single-use proxy exchange: read one request (head and
//! `Content-Length` body) from a client, re-frame it for the upstream with `Connection: close`,
//! read one complete response back, and re-frame it for the client with `Connection: close`.
//!
//! This module works on byte streams only. It must not know about faults, counters, sockets or
//! the sqlhttp wire protocol.

use http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest request or response head accepted, in bytes.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The largest request body accepted, in bytes.
pub(crate) const MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;
/// The most header fields in one head.
const MAX_HEADERS: usize = 128;
/// Bytes asked for on each read.
const READ_CHUNK: usize = 16 * 1024;

/// Headers that describe one connection rather than the message, dropped when re-framing.
/// `Expect` is answered by the proxy itself; `Transfer-Encoding` is refused on requests.
const REQUEST_HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];
const RESPONSE_HOP_BY_HOP: &[&str] = &["connection", "keep-alive", "proxy-connection"];

/// Why no request could be read from a client.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The client went away (or failed) before sending a whole request: nothing to answer.
    Gone,
    /// The request cannot be proxied: answer with this status and explanation, then close.
    Reject(StatusCode, &'static str),
}

impl From<std::io::Error> for RequestError {
    fn from(_: std::io::Error) -> Self {
        RequestError::Gone
    }
}

/// One request read from a client, already framed for the upstream.
#[derive(Debug)]
pub(crate) struct ProxiedRequest {
    /// Head and body to write to the upstream, ending the exchange with `Connection: close`.
    pub(crate) bytes: Vec<u8>,
    /// Whether the method was `HEAD` (the response then has no body whatever it says).
    pub(crate) is_head: bool,
}

/// A parsed head, owned.
#[derive(Debug)]
struct Head {
    /// Bytes the head takes, blank line included.
    len: usize,
    /// The start line's parts: (method, target) of a request, (status code, reason) of a response.
    start: (String, String),
    fields: Vec<(String, Vec<u8>)>,
}

impl Head {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_slice())
    }

    fn has(&self, name: &str) -> bool {
        self.values(name).next().is_some()
    }

    /// The `Content-Length`, `Err` when present but invalid or contradictory.
    fn content_length(&self) -> Result<Option<u64>, ()> {
        let mut found = None;
        for value in self.values("content-length") {
            let text = std::str::from_utf8(value).map_err(|_| ())?.trim();
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(());
            }
            let length: u64 = text.parse().map_err(|_| ())?;
            if found.is_some_and(|seen| seen != length) {
                return Err(());
            }
            found = Some(length);
        }
        Ok(found)
    }

    /// Writes the start line from `line` and every field not in `drop`, then
    /// `connection: close` and the blank line.
    fn encode(&self, line: String, drop: &[&str]) -> Vec<u8> {
        let mut out = line.into_bytes();
        for (name, value) in &self.fields {
            if drop.iter().any(|hop| name.eq_ignore_ascii_case(hop)) {
                continue;
            }
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"connection: close\r\n\r\n");
        out
    }
}

fn owned_fields(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect()
}

/// Parses a request head at the start of `buf`: `Ok(None)` while incomplete.
fn parse_request_head(buf: &[u8]) -> Result<Option<Head>, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    Ok(match request.parse(buf)? {
        httparse::Status::Partial => None,
        httparse::Status::Complete(len) => Some(Head {
            len,
            start: (
                request.method.unwrap_or_default().to_owned(),
                request.path.unwrap_or_default().to_owned(),
            ),
            fields: owned_fields(request.headers),
        }),
    })
}

/// Parses a response head at the start of `buf`: `Ok(None)` while incomplete.
fn parse_response_head(buf: &[u8]) -> Result<Option<Head>, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    Ok(match response.parse(buf)? {
        httparse::Status::Partial => None,
        httparse::Status::Complete(len) => Some(Head {
            len,
            start: (
                response.code.unwrap_or_default().to_string(),
                response.reason.unwrap_or_default().to_owned(),
            ),
            fields: owned_fields(response.headers),
        }),
    })
}

/// Reads more bytes into `buf`; `Ok(0)` at end of stream.
async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    buf.reserve(READ_CHUNK);
    stream.read_buf(buf).await
}

/// Reads until `buf` holds a whole head that `parse` accepts; `Ok(None)` when the stream ends
/// first with nothing read, `Err` with the reason otherwise.
async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    parse: fn(&[u8]) -> Result<Option<Head>, httparse::Error>,
) -> Result<Option<Head>, HeadError> {
    loop {
        if !buf.is_empty() {
            match parse(buf) {
                Ok(Some(head)) => return Ok(Some(head)),
                Ok(None) => {}
                Err(_) => return Err(HeadError::Malformed),
            }
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        if read_more(stream, buf).await.map_err(HeadError::Io)? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(HeadError::Truncated)
            };
        }
    }
}

#[derive(Debug)]
enum HeadError {
    Malformed,
    TooLarge,
    Truncated,
    Io(std::io::Error),
}

/// Reads one request from a client. Answers `Expect: 100-continue` itself. Refuses chunked
/// request bodies (`Transfer-Encoding`), malformed heads, and bodies over [`MAX_BODY_BYTES`].
pub(crate) async fn read_request<S>(client: &mut S) -> Result<ProxiedRequest, RequestError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = Vec::with_capacity(READ_CHUNK);
    let head = match read_head(client, &mut buf, parse_request_head).await {
        Ok(Some(head)) => head,
        Ok(None) | Err(HeadError::Truncated | HeadError::Io(_)) => return Err(RequestError::Gone),
        Err(HeadError::Malformed) => {
            return Err(RequestError::Reject(
                StatusCode::BAD_REQUEST,
                "malformed request head",
            ));
        }
        Err(HeadError::TooLarge) => {
            return Err(RequestError::Reject(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request head too large",
            ));
        }
    };
    if head.has("transfer-encoding") {
        return Err(RequestError::Reject(
            StatusCode::BAD_REQUEST,
            "the sqlhttp-testkit proxy does not accept chunked request bodies: send Content-Length",
        ));
    }
    let length = head
        .content_length()
        .map_err(|()| RequestError::Reject(StatusCode::BAD_REQUEST, "invalid Content-Length"))?;
    let length = length.unwrap_or(0);
    if length > MAX_BODY_BYTES {
        return Err(RequestError::Reject(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body over the sqlhttp-testkit proxy's limit",
        ));
    }
    // Checked against MAX_BODY_BYTES above, so it fits in memory and in usize.
    let wanted = head.len + usize::try_from(length).unwrap_or(usize::MAX);
    let expects_continue = head
        .values("expect")
        .any(|v| v.eq_ignore_ascii_case(b"100-continue"));
    if expects_continue && buf.len() < wanted {
        client.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    while buf.len() < wanted {
        if read_more(client, &mut buf).await? == 0 {
            return Err(RequestError::Gone);
        }
    }
    let line = format!("{} {} HTTP/1.1\r\n", head.start.0, head.start.1);
    let mut bytes = head.encode(line, REQUEST_HOP_BY_HOP);
    bytes.extend_from_slice(&buf[head.len..wanted]);
    Ok(ProxiedRequest {
        bytes,
        is_head: head.start.0.eq_ignore_ascii_case("HEAD"),
    })
}

/// Reads one complete response from the upstream (skipping interim `1xx` responses) and returns
/// it framed for the client with `Connection: close`. The body is read by `Content-Length`, or
/// to the end of the stream when the response has none or is chunked (the upstream was asked to
/// close after it).
pub(crate) async fn read_response<S>(upstream: &mut S, is_head: bool) -> std::io::Result<Vec<u8>>
where
    S: AsyncRead + Unpin,
{
    let mut buf = Vec::with_capacity(READ_CHUNK);
    let head = loop {
        let head = match read_head(upstream, &mut buf, parse_response_head).await {
            Ok(Some(head)) => head,
            Ok(None) | Err(HeadError::Truncated) => {
                return Err(invalid(
                    std::io::ErrorKind::UnexpectedEof,
                    "upstream closed before a response",
                ));
            }
            Err(HeadError::Malformed) => {
                return Err(invalid(
                    std::io::ErrorKind::InvalidData,
                    "malformed response head",
                ));
            }
            Err(HeadError::TooLarge) => {
                return Err(invalid(
                    std::io::ErrorKind::InvalidData,
                    "response head too large",
                ));
            }
            Err(HeadError::Io(error)) => return Err(error),
        };
        let interim = head.start.0.starts_with('1') && head.start.0 != "101";
        if !interim {
            break head;
        }
        buf.drain(..head.len);
    };
    let status = head.start.0.as_str();
    let bodiless = is_head || status.starts_with('1') || status == "204" || status == "304";
    let length = head
        .content_length()
        .map_err(|()| invalid(std::io::ErrorKind::InvalidData, "invalid Content-Length"))?;
    let end = if bodiless {
        Some(head.len)
    } else if head.has("transfer-encoding") {
        None
    } else {
        length.map(|length| {
            head.len
                .saturating_add(usize::try_from(length).unwrap_or(usize::MAX))
        })
    };
    match end {
        Some(end) => {
            while buf.len() < end {
                if read_more(upstream, &mut buf).await? == 0 {
                    return Err(invalid(
                        std::io::ErrorKind::UnexpectedEof,
                        "upstream closed mid-body",
                    ));
                }
            }
            buf.truncate(end);
        }
        None => while read_more(upstream, &mut buf).await? != 0 {},
    }
    let line = format!("HTTP/1.1 {} {}\r\n", head.start.0, head.start.1);
    let mut out = head.encode(line, RESPONSE_HOP_BY_HOP);
    out.extend_from_slice(&buf[head.len..]);
    Ok(out)
}

fn invalid(kind: std::io::ErrorKind, what: &str) -> std::io::Error {
    std::io::Error::new(kind, what.to_owned())
}

/// A complete response with `Content-Length` and `Connection: close`. Any `Content-Length`,
/// `Connection` or `Transfer-Encoding` in `headers` is left out (the framing is the proxy's).
pub(crate) fn encode_response(
    status: StatusCode,
    headers: &[(String, String)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in headers {
        let framing = ["content-length", "connection", "transfer-encoding"];
        if framing.iter().any(|f| name.eq_ignore_ascii_case(f)) {
            continue;
        }
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(body);
    out
}

/// A plain-text response from the proxy itself (gateway errors, refused requests).
pub(crate) fn text_response(status: StatusCode, text: &str) -> Vec<u8> {
    let headers = [(
        "content-type".to_owned(),
        "text/plain; charset=utf-8".to_owned(),
    )];
    encode_response(status, &headers, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn request_from(raw: &[u8]) -> (Result<ProxiedRequest, RequestError>, Vec<u8>) {
        let (mut near, mut far) = tokio::io::duplex(1 << 20);
        far.write_all(raw).await.unwrap();
        far.shutdown().await.unwrap();
        let result = read_request(&mut near).await;
        drop(near);
        let mut answered = Vec::new();
        far.read_to_end(&mut answered).await.unwrap();
        (result, answered)
    }

    async fn response_from(raw: &[u8], is_head: bool) -> std::io::Result<Vec<u8>> {
        read_response(&mut &raw[..], is_head).await
    }

    #[tokio::test]
    async fn request_is_reframed_with_connection_close() {
        let raw = b"POST /api/v1/sql HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 4\r\n\r\nbodyEXTRA";
        let (result, _) = request_from(raw).await;
        let request = result.unwrap();
        let text = String::from_utf8(request.bytes).unwrap();
        assert_eq!(
            text,
            "POST /api/v1/sql HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nconnection: close\r\n\r\nbody"
        );
        assert!(!request.is_head);
    }

    #[tokio::test]
    async fn chunked_request_is_rejected() {
        let raw = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        let (result, _) = request_from(raw).await;
        assert!(matches!(
            result,
            Err(RequestError::Reject(StatusCode::BAD_REQUEST, _))
        ));
    }

    #[tokio::test]
    async fn conflicting_content_lengths_are_rejected() {
        let raw = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab";
        let (result, _) = request_from(raw).await;
        assert!(matches!(
            result,
            Err(RequestError::Reject(StatusCode::BAD_REQUEST, _))
        ));
    }

    #[tokio::test]
    async fn short_body_means_the_client_is_gone() {
        let raw = b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        let (result, _) = request_from(raw).await;
        assert!(matches!(result, Err(RequestError::Gone)));
        let (result, _) = request_from(b"").await;
        assert!(matches!(result, Err(RequestError::Gone)));
    }

    #[tokio::test]
    async fn expect_continue_is_answered_and_stripped() {
        let (mut near, mut far) = tokio::io::duplex(1 << 16);
        far.write_all(b"PUT /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
            .await
            .unwrap();
        let reader = tokio::spawn(async move { read_request(&mut near).await.map(|r| r.bytes) });
        let mut interim = [0u8; 25];
        far.read_exact(&mut interim).await.unwrap();
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        far.write_all(b"ok").await.unwrap();
        let bytes = reader.await.unwrap().unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "PUT /x HTTP/1.1\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok"
        );
    }

    #[tokio::test]
    async fn response_by_content_length_ignores_trailing_bytes() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nhiJUNK";
        let out = response_from(raw, false).await.unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nhi"
        );
    }

    #[tokio::test]
    async fn chunked_response_is_read_to_end_and_interim_responses_skipped() {
        let raw = b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
        let out = response_from(raw, false).await.unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nconnection: close\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn response_cut_short_is_an_error() {
        let error = response_from(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhi", false)
            .await
            .unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        let error = response_from(b"", false).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        let error = response_from(b"garbage\r\n\r\n", false).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn head_and_no_content_responses_have_no_body() {
        let out = response_from(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true)
            .await
            .unwrap();
        assert!(out.ends_with(b"connection: close\r\n\r\n"));
        let out = response_from(b"HTTP/1.1 204 No Content\r\n\r\n", false)
            .await
            .unwrap();
        assert!(out.ends_with(b"connection: close\r\n\r\n"));
    }

    #[test]
    fn canned_response_owns_its_framing() {
        let headers = [
            ("Retry-After".to_owned(), "2".to_owned()),
            ("Content-Length".to_owned(), "999".to_owned()),
        ];
        let out = encode_response(StatusCode::TOO_MANY_REQUESTS, &headers, b"{}");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
        );
    }
}
