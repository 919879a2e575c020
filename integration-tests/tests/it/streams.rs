//! Streamed results end to end (ADR 0016): rows as they arrive through `Query::fetch`, retried
//! until the first row and never after, a cut body or the server's error mid-result never taken
//! for a whole one, and `fetch_one` on a huge result leaving the server free.

use std::time::Duration;

use serde::Deserialize;
use sqlhttp::{ErrorKind, RowStream};
use sqlhttp_server::{Config, Limits};
use sqlhttp_testkit::Fault;

use crate::harness::*;

/// `n` computed rows of about 20 bytes each: a body of many chunks, no table needed.
fn counted(n: u64) -> String {
    format!(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) \
         SELECT x AS n, 'row ' || x AS label FROM c"
    )
}

/// An engine error at row 20 000, after several chunks of the body have gone out: abs() of the
/// smallest integer overflows on SQLite; PostgreSQL would fold that constant before the first row,
/// so there a division by zero that depends on the row.
async fn fails_at_row_20000(live: &Live) -> &'static str {
    match live.engine().await {
        Engine::Sqlite => {
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 30000) \
             SELECT CASE WHEN x < 20000 THEN x ELSE abs(-9223372036854775807 - 1) END AS n FROM c"
        }
        Engine::Postgres => {
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 30000) \
             SELECT CASE WHEN x < 20000 THEN x ELSE 1 / (x - x) END AS n FROM c"
        }
    }
}

#[derive(Debug, Deserialize, PartialEq)]
struct Counted {
    n: i64,
    label: String,
}

fn expected(n: u64) -> Vec<Counted> {
    (1..=n as i64)
        .map(|n| Counted {
            n,
            label: format!("row {n}"),
        })
        .collect()
}

/// Reads a stream to its end: the rows, and the error that ended it, if any.
async fn drain<T: serde::de::DeserializeOwned + Send>(
    mut rows: RowStream<T>,
) -> (Vec<T>, Option<sqlhttp::Error>) {
    let mut got = Vec::new();
    loop {
        match rows.try_next().await {
            Ok(Some(row)) => got.push(row),
            Ok(None) => return (got, None),
            Err(err) => {
                assert!(
                    rows.try_next().await.unwrap().is_none(),
                    "a stream ends after its error"
                );
                return (got, Some(err));
            }
        }
    }
}

#[tokio::test]
async fn a_stream_yields_every_row_with_its_columns() {
    let live = Live::start().await;
    let rows = live
        .client()
        .query(counted(50_000))
        .fetch::<Counted>()
        .await
        .unwrap();
    let names: Vec<&str> = rows.columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["n", "label"]);
    let (got, err) = drain(rows).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got, expected(50_000));
}

#[tokio::test]
async fn a_body_cut_mid_stream_is_an_error_never_a_clean_end() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    // 100 kB: the head and a few chunks of rows, then the connection closes. Uncompressed, so
    // that 100 kB is a fraction of the body.
    proxy.push(Fault::Truncate(100_000));
    let client = live
        .via(&proxy)
        .http_client(
            reqwest::Client::builder()
                .no_gzip()
                .no_zstd()
                .retry(reqwest::retry::never())
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let rows = client
        .query(counted(20_000))
        .fetch::<Counted>()
        .await
        .unwrap();
    let (got, err) = drain(rows).await;
    let err = err.expect("the cut ends the stream with an error");
    assert!(err.is_connection(), "{err:?}");
    assert_eq!(err.attempts(), 1);
    assert!(!got.is_empty() && got.len() < 20_000, "{} rows", got.len());
    assert_eq!(
        got[..],
        expected(got.len() as u64)[..],
        "the rows before the cut"
    );
    assert_eq!(
        proxy.requests(),
        1,
        "never retried once rows were handed over"
    );

    // fetch_all hands nothing over before the end: the same cut is retried and completes.
    proxy.push(Fault::Truncate(100_000));
    let all: Vec<Counted> = client.query(counted(20_000)).fetch_all().await.unwrap();
    assert_eq!(all, expected(20_000));
    assert_eq!(proxy.requests(), 3);
}

#[tokio::test]
async fn failures_before_the_first_row_are_retried_and_the_stream_is_complete() {
    let live = Live::start().await;
    let proxy = live.proxy().await;
    proxy.push_all([
        Fault::Truncate(30),
        Fault::unavailable(0),
        Fault::DropAfterForward,
        Fault::ResetBeforeForward,
    ]);
    let client = live
        .via(&proxy)
        .retry(fast().with_max_attempts(5))
        .build()
        .unwrap();
    let rows = client
        .query(counted(20_000))
        .fetch::<Counted>()
        .await
        .unwrap();
    let (got, err) = drain(rows).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got, expected(20_000));
    assert_eq!(proxy.requests(), 5);
}

#[tokio::test]
async fn an_engine_error_at_row_n_fails_fetch_all_and_the_stream() {
    let live = Live::start().await;
    let client = live.client();
    let err = client
        .query(fails_at_row_20000(&live).await)
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Sql { message, .. }
                if message.contains("integer overflow") || message.contains("division by zero")
        ),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 1, "an SQL error is final");

    let rows = client
        .query(fails_at_row_20000(&live).await)
        .fetch::<i64>()
        .await
        .unwrap();
    let (got, err) = drain(rows).await;
    let err = err.expect("the stream ends with the engine's error");
    assert!(matches!(err.kind(), ErrorKind::Sql { .. }), "{err:?}");
    assert_eq!(got, (1..20_000).collect::<Vec<i64>>());
}

#[tokio::test]
async fn fetch_one_on_a_huge_result_leaves_the_server_free() {
    let live = Live::with_config(Config {
        limits: Limits {
            read_connections: 1,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let client = live.client();
    let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";
    let first: i64 = client.query(endless).fetch_one().await.unwrap();
    assert_eq!(first, 1);
    let first: Option<i64> = client.query(endless).fetch_optional().await.unwrap();
    assert_eq!(first, Some(1));
    // The only reader is free again well before the 30 s statement timeout.
    let one: i64 =
        tokio::time::timeout(Duration::from_secs(5), client.query("SELECT 1").fetch_one())
            .await
            .expect("the reader was released")
            .unwrap();
    assert_eq!(one, 1);
}
