//! Reading a request body up to the configured limit, answering `413 PAYLOAD_TOO_LARGE` with
//! the protocol's JSON body (not the framework's plain-text one). An oversized body of moderate
//! size is read to its end and discarded before the answer, so the client, still sending, is not
//! reset before it can read the `413` (proxies make that race likely).
//!
//! Bodies count against the server-wide [`Budget`] from their first byte (their declared
//! length, when they have one) until their request is answered: past it a request is answered
//! `503 UNAVAILABLE` with `Retry-After` before anything runs, so many slow or large uploads at
//! once cannot hold more memory than `--max-buffered-bytes` together.
//!
//! Knows HTTP bodies and headers only.

use std::future::poll_fn;
use std::pin::Pin;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderMap, header};

use crate::budget::{Budget, Held};
use crate::protocol::error::{ApiError, ErrorCode};

/// Oversized bodies up to this size are drained before `413`; larger ones are cut at once.
const DRAIN_AT_MOST: u64 = 16 * 1024 * 1024;

/// Reads and discards what is left of `body`, up to [`DRAIN_AT_MOST`] bytes in all.
async fn drain(mut body: Body, already: u64) {
    let mut seen = already;
    while seen <= DRAIN_AT_MOST {
        match poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            Some(Ok(frame)) => {
                seen += frame.data_ref().map_or(0, |data| data.len() as u64);
            }
            Some(Err(_)) | None => return,
        }
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("the request body is larger than this server's limit of {limit} bytes"),
    )
}

/// A whole response body that holds its share of the server's budget until its last byte has
/// been taken, handed out in pieces of [`PIECE`] bytes: hyper takes the next piece only when its
/// write buffer has room, so a client that reads nothing keeps the body here, counted, and the
/// budget is given back when the body is done or dropped (the client left, or the send timeout
/// closed its connection).
pub(crate) struct Holding {
    rest: Bytes,
    held: Option<Held>,
}

/// The size of the pieces a [`Holding`] body is handed out in.
const PIECE: usize = 64 * 1024;

impl Holding {
    pub(crate) fn new(body: Bytes, held: Held) -> Holding {
        Holding {
            rest: body,
            held: Some(held),
        }
    }
}

impl HttpBody for Holding {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
            self.held = None;
            return std::task::Poll::Ready(None);
        }
        let take = self.rest.len().min(PIECE);
        let piece = self.rest.split_to(take);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// Collects `body` within `budget`, refusing it as soon as it is known to exceed `limit` bytes
/// (from `Content-Length` before reading anything, else while reading). The body's share of the
/// budget is held until the returned [`Held`] is dropped.
pub(crate) async fn read_limited(
    mut body: Body,
    headers: &HeaderMap,
    limit: usize,
    budget: &Budget,
) -> Result<(Bytes, Held), ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > limit as u64
    {
        if declared <= DRAIN_AT_MOST {
            drain(body, 0).await;
        }
        return Err(too_large(limit));
    }
    let mut held = Held::default();
    let declared = declared.map_or(0, |d| d as usize);
    budget.cover(&mut held, declared)?;
    let mut collected = Vec::with_capacity(declared);
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame =
            frame.map_err(|_| ApiError::bad_request("the request body could not be read"))?;
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > limit {
                drain(body, (collected.len() + data.len()) as u64).await;
                return Err(too_large(limit));
            }
            budget.cover(&mut held, collected.len() + data.len())?;
            collected.extend_from_slice(&data);
        }
    }
    Ok((Bytes::from(collected), held))
}

/// [`read_limited`] within `timeout` (`408 REQUEST_TIMEOUT` past it).
pub(crate) async fn read_within(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    budget: &Budget,
    timeout: std::time::Duration,
) -> Result<(Bytes, Held), ApiError> {
    tokio::time::timeout(timeout, read_limited(body, headers, limit, budget))
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorCode::RequestTimeout,
                format!(
                    "the request body did not arrive within {} ms",
                    timeout.as_millis()
                ),
            )
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn enforces_the_limit_with_and_without_content_length() {
        let budget = Budget::new(1 << 20);
        let (ok, _held) = read_limited(Body::from("12345"), &HeaderMap::new(), 5, &budget)
            .await
            .unwrap();
        assert_eq!(&ok[..], b"12345");
        let err = read_limited(Body::from("123456"), &HeaderMap::new(), 5, &budget)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "6".parse().unwrap());
        let err = read_limited(Body::empty(), &headers, 5, &budget)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
    }

    #[tokio::test]
    async fn bodies_together_stay_within_the_budget_until_answered() {
        let budget = Budget::new(10 * 1024);
        let body = || Body::from(vec![b'x'; 6 * 1024]);
        let (_, first) = read_limited(body(), &HeaderMap::new(), 1 << 20, &budget)
            .await
            .unwrap();
        let refused = read_limited(body(), &HeaderMap::new(), 1 << 20, &budget)
            .await
            .unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unavailable);
        assert!(
            refused.message.contains("--max-buffered-bytes"),
            "{}",
            refused.message
        );
        // What the refused body had taken was given back, and the first one's share with it.
        drop(first);
        let (_, second) = read_limited(body(), &HeaderMap::new(), 1 << 20, &budget)
            .await
            .unwrap();
        drop(second);
        assert_eq!(budget.available_kib(), 10);
    }
}
