//! `Query::fetch` on the wire: the stream it returns sends its request when first read (or when
//! awaited), retries before the first row, and reads as a `futures_core::Stream` too.

use std::future::poll_fn;
use std::pin::Pin;

use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::support::*;

#[tokio::test]
async fn fetch_returns_a_stream_that_starts_when_read() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .respond_with(ok_rows(&["n"], &json!([[1], [2], [3]])))
        .mount(&server)
        .await;
    let client = client_with(&server, quick(3));

    let mut rows = client.query("SELECT n FROM t").fetch::<i64>();
    assert!(rows.columns().is_empty(), "nothing was sent yet");
    assert!(server.received_requests().await.unwrap().is_empty());
    let mut got = Vec::new();
    while let Some(n) = rows.try_next().await.unwrap() {
        got.push(n);
    }
    assert_eq!(got, [1, 2, 3]);
    assert_eq!(rows.columns()[0].name(), "n");

    // Awaited, it waits for the first row: the columns are known at once.
    let awaited = client
        .query("SELECT n FROM t")
        .fetch::<i64>()
        .await
        .unwrap();
    assert_eq!(awaited.columns().len(), 1);

    // Read as a `Stream`.
    let mut stream = client.query("SELECT n FROM t").fetch::<i64>();
    let mut polled = Vec::new();
    while let Some(row) =
        poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut stream), cx)).await
    {
        polled.push(row.unwrap());
    }
    assert_eq!(polled, [1, 2, 3]);
    assert_eq!(server.received_requests().await.unwrap().len(), 3);
}

#[tokio::test]
async fn an_execute_stream_is_never_retried_not_even_before_its_first_row() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let client = client_with(&server, quick(3));
    let mut rows = client.execute("DELETE FROM t RETURNING n").fetch::<i64>();
    let err = rows.try_next().await.unwrap_err();
    assert_eq!(err.attempts(), 1, "{err:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
    assert!(rows.try_next().await.unwrap().is_none(), "the stream ended");
}

#[tokio::test]
async fn a_failure_before_the_first_row_is_retried_then_comes_from_the_first_read() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .respond_with(error(400, "SQL_ERROR", "no such table: t"))
        .mount(&server)
        .await;
    let client = client_with(&server, quick(3));
    let mut rows = client.query("SELECT n FROM t").fetch::<i64>();
    let err = rows.try_next().await.unwrap_err();
    assert!(
        matches!(err.kind(), sqlhttp::ErrorKind::Sql { .. }),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 2, "the 503 was retried");
    assert!(rows.try_next().await.unwrap().is_none(), "the stream ended");
}
