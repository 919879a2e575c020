//! Reading a request body up to the configured limit, answering `413 PAYLOAD_TOO_LARGE` with
//! the protocol's JSON body (not the framework's plain-text one). An oversized body of moderate
//! size is read to its end and discarded before the answer, so the client, still sending, is not
//! reset before it can read the `413` (proxies make that race likely).
//!
//! Knows HTTP bodies and headers only.

use std::future::poll_fn;
use std::pin::Pin;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderMap, header};

use crate::api_error::{ApiError, ErrorCode};

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

/// Collects `body`, refusing it as soon as it is known to exceed `limit` bytes (from
/// `Content-Length` before reading anything, else while reading).
pub(crate) async fn read_limited(
    mut body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, ApiError> {
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
    let mut collected = Vec::with_capacity(declared.map_or(0, |d| d as usize));
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame =
            frame.map_err(|_| ApiError::bad_request("the request body could not be read"))?;
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > limit {
                drain(body, (collected.len() + data.len()) as u64).await;
                return Err(too_large(limit));
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(collected))
}

/// [`read_limited`] within `timeout` (`408 REQUEST_TIMEOUT` past it).
pub(crate) async fn read_within(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    tokio::time::timeout(timeout, read_limited(body, headers, limit))
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
        let ok = read_limited(Body::from("12345"), &HeaderMap::new(), 5)
            .await
            .unwrap();
        assert_eq!(&ok[..], b"12345");
        let err = read_limited(Body::from("123456"), &HeaderMap::new(), 5)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "6".parse().unwrap());
        let err = read_limited(Body::empty(), &headers, 5).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
    }
}
