//! Per-call settings, caller-held keys, `execute ... RETURNING`, and what an error tells the caller
//! (was it sent, is the outcome unknown, which key to re-send with, the cause behind it), through the
//! public API against wiremock.

use std::error::Error as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlhttp::{Client, ErrorKind, RetryPolicy};
use tokio::time::Instant;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::support::*;

#[derive(Serialize)]
struct Event {
    id: i64,
    secret: String,
}

fn events(n: usize) -> Vec<Event> {
    (0..n as i64)
        .map(|id| Event {
            id,
            secret: format!("row-secret-{id}"),
        })
        .collect()
}

fn key_in_use(retry_after: &str) -> ResponseTemplate {
    error(
        409,
        "IDEMPOTENCY_KEY_IN_USE",
        "a request with this key is running",
    )
    .insert_header("retry-after", retry_after)
}

#[tokio::test(start_paused = true)]
async fn a_write_whose_key_is_in_use_waits_for_retry_after() {
    let server = server().await;
    respond_times(&server, key_in_use("2"), 1).await;
    respond_always(&server, ok_effect(1, Some(1))).await;
    let client = builder(&server).retry_writes(true).build().unwrap();
    let started = Instant::now();
    assert_eq!(client.insert("events", &events(1)).await.unwrap(), 1);
    let waited = started.elapsed();
    assert!(
        // 2 s, plus up to a tenth of it spread at random (full jitter).
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2_300),
        "the computed backoff would be at most 100 ms: {waited:?}"
    );
    let keys = header_values(&server, "idempotency-key").await;
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
}

#[tokio::test(start_paused = true)]
async fn a_write_out_of_attempts_on_a_key_in_use_carries_the_key_to_re_send() {
    let server = server().await;
    respond_always(&server, key_in_use("1")).await;
    let client = builder(&server).retry_writes(true).build().unwrap();
    let err = client
        .insert("events", &events(2))
        .idempotency_key("import-2024-06-01")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::IdempotencyKeyInUse { .. }),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 3);
    assert!(err.is_sent() && err.is_outcome_unknown() && err.is_retryable());
    assert_eq!(err.idempotency_key(), Some("import-2024-06-01"));
    assert_eq!(err.code(), Some("IDEMPOTENCY_KEY_IN_USE"));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert!(err.to_string().contains("import-2024-06-01"), "{err}");
}

#[tokio::test]
async fn a_caller_held_key_is_sent_as_given_and_chunks_derive_theirs() {
    let server = server().await;
    respond_always(&server, ok_effect(2, None)).await;
    let client = builder(&server).insert_max_params(4).build().unwrap();
    // One statement: the key as given.
    client
        .insert("events", &events(2))
        .idempotency_key("batch-7")
        .await
        .unwrap();
    // Three statements of two rows: one key per statement, in order.
    client
        .insert("events", &events(6))
        .idempotency_key("batch-8")
        .await
        .unwrap();
    assert_eq!(
        header_values(&server, "idempotency-key").await,
        vec!["batch-7", "batch-8/0", "batch-8/1", "batch-8/2"]
    );
}

#[tokio::test]
async fn a_re_send_with_the_same_key_sends_the_same_keys_and_bodies() {
    let server = server().await;
    respond_always(&server, ok_effect(2, None)).await;
    let client = builder(&server).insert_max_params(4).build().unwrap();
    for _ in 0..2 {
        client
            .insert("events", &events(4))
            .idempotency_key("job-1")
            .await
            .unwrap();
    }
    let requests = server.received_requests().await.unwrap();
    let sent: Vec<_> = requests
        .iter()
        .map(|r| {
            (
                r.headers["idempotency-key"].to_str().unwrap().to_owned(),
                r.body.clone(),
            )
        })
        .collect();
    assert_eq!(sent.len(), 4);
    assert_eq!(
        sent[..2],
        sent[2..],
        "deterministic: a re-send is the same requests"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_chunk_reports_the_calls_key_not_the_chunks() {
    let server = server().await;
    respond_times(&server, ok_effect(2, None), 1).await;
    respond_always(&server, error(503, "UNAVAILABLE", "busy")).await;
    let client = builder(&server)
        .insert_max_params(4)
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    let err = client.insert("events", &events(4)).await.unwrap_err();
    assert_eq!(err.rows_inserted(), Some(2));
    let keys = header_values(&server, "idempotency-key").await;
    let call_key = keys[0]
        .strip_suffix("/0")
        .expect("chunk keys are {key}/{index}");
    assert_eq!(keys[1], format!("{call_key}/1"));
    assert_eq!(
        err.idempotency_key(),
        Some(call_key),
        "re-send the whole insert with it"
    );
    assert!(!err.is_outcome_unknown(), "a 503 is an answer: not applied");
}

#[tokio::test]
async fn a_key_that_breaks_the_protocols_rule_fails_before_sending() {
    let server = server().await;
    respond_always(&server, ok_effect(1, None)).await;
    let client = builder(&server).insert_max_params(2).build().unwrap();
    for key in [
        String::new(),
        "has space".into(),
        "é".into(),
        "k".repeat(256),
    ] {
        let err = client
            .insert("events", &events(1))
            .idempotency_key(key.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Config { .. }),
            "{key:?}: {err:?}"
        );
        assert!(!err.is_sent());
    }
    // 255 characters fit one statement, not `{key}/{index}` for two.
    let err = client
        .insert("events", &events(2))
        .idempotency_key("k".repeat(255))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    assert_eq!(hits(&server).await, 0);
}

#[tokio::test(start_paused = true)]
async fn per_call_retry_and_retry_writes_win_over_the_clients() {
    let server = server().await;
    respond_always(&server, error(503, "UNAVAILABLE", "busy")).await;
    let client = builder(&server)
        .retry(RetryPolicy::never().with_jitter_seed(1))
        .build()
        .unwrap();
    let err = client
        .query("SELECT 1")
        .retry(RetryPolicy::new().with_max_attempts(4).with_jitter_seed(1))
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 4);
    assert_eq!(
        attempt_headers(&server).await,
        vec!["1/4", "2/4", "3/4", "4/4"]
    );
    server.reset().await;
    respond_always(&server, error(503, "UNAVAILABLE", "busy")).await;

    let err = client
        .query_table("SELECT 1")
        .retry(RetryPolicy::new().with_max_attempts(2).with_jitter_seed(1))
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 2);

    let err = client
        .insert("events", &events(1))
        .retry(RetryPolicy::new().with_max_attempts(3).with_jitter_seed(1))
        .retry_writes(true)
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 3);

    // The client retries writes; this call does not.
    let retrying = builder(&server).retry_writes(true).build().unwrap();
    let err = retrying
        .insert("events", &events(1))
        .retry_writes(false)
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 1);
    // And the client's retries stand for a call that does not override them.
    let err = retrying
        .query("SELECT 1")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_per_call_timeout_wins_over_the_clients() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(&["n"], &json!([[1]])).set_delay(Duration::from_secs(5)),
    )
    .await;
    let client = builder(&server)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = client
        .query("SELECT n")
        .timeout(Duration::from_secs(1))
        .retry(RetryPolicy::never())
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::Timeout {
            after: Duration::from_secs(1)
        }
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // A long report: no timeout for this call. (On the paused clock, any timer would fire before the
    // mock's real-time delay ends, so only a call without one can succeed.)
    let server = crate::support::server().await;
    respond_always(
        &server,
        ok_rows(&["n"], &json!([[1]])).set_delay(Duration::from_millis(200)),
    )
    .await;
    let short = builder(&server)
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let rows: Vec<i64> = short
        .query("SELECT n")
        .timeout(None)
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(rows, vec![1]);
}

#[tokio::test]
async fn settings_that_cannot_work_fail_the_call_before_sending() {
    let server = server().await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server).build().unwrap();
    let err = client
        .query("SELECT 1")
        .retry(RetryPolicy::new().with_max_attempts(0))
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    let err = client
        .execute("DELETE FROM t")
        .timeout(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    assert_eq!(hits(&server).await, 0);
}

#[derive(Debug, Deserialize, PartialEq)]
struct Created {
    id: i64,
    name: String,
}

#[tokio::test]
async fn execute_decodes_returning_rows() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .and(header("content-type", "application/json"))
        .respond_with(ok_rows(&["id", "name"], &json!([[7, "ada"], [8, "grace"]])))
        .mount(&server)
        .await;
    let client = builder(&server).build().unwrap();
    let sql = "INSERT INTO users (name) VALUES (?), (?) RETURNING id, name";
    let all: Vec<Created> = client
        .execute(sql)
        .bind("ada")
        .bind("grace")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(
        all,
        vec![
            Created {
                id: 7,
                name: "ada".into()
            },
            Created {
                id: 8,
                name: "grace".into()
            }
        ]
    );
    let one: (i64, String) = client.execute(sql).fetch_one().await.unwrap();
    assert_eq!(one, (7, "ada".into()));
    let first: Option<(i64, String)> = client.execute(sql).fetch_optional().await.unwrap();
    assert_eq!(first, Some((7, "ada".into())));
    assert_eq!(
        header_values(&server, "idempotency-key").await,
        vec![""; 3],
        "execute carries no key"
    );
}

#[tokio::test]
async fn execute_returning_no_rows() {
    let server = server().await;
    respond_always(&server, ok_rows(&["id"], &json!([]))).await;
    let client = builder(&server).build().unwrap();
    let none: Option<i64> = client
        .execute("DELETE FROM t WHERE id = 1 RETURNING id")
        .fetch_optional()
        .await
        .unwrap();
    assert_eq!(none, None);
    let err = client
        .execute("DELETE FROM t WHERE id = 1 RETURNING id")
        .fetch_one::<i64>()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::RowNotFound);
}

#[tokio::test(start_paused = true)]
async fn execute_returning_is_never_retried() {
    let server = server().await;
    respond_always(&server, error(503, "UNAVAILABLE", "busy")).await;
    let client = builder(&server)
        .retry_writes(true)
        .retry(RetryPolicy::new().with_max_attempts(10))
        .build()
        .unwrap();
    let err = client
        .execute("INSERT INTO t (x) VALUES (1) RETURNING id")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!((err.attempts(), hits(&server).await), (1, 1));
    assert_eq!(attempt_headers(&server).await, vec!["1/1"]);
}

#[tokio::test]
async fn every_post_says_its_body_is_json() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .and(header("content-type", "application/json"))
        .respond_with(ok_effect(1, Some(1)))
        .mount(&server)
        .await;
    let client = builder(&server).build().unwrap();
    client.execute("DELETE FROM t").await.unwrap();
    client.insert("events", &events(1)).await.unwrap();
    client.query_table("SELECT 1").await.unwrap();
    client.query("SELECT 1").fetch_all::<i64>().await.unwrap();
    client
        .execute("DELETE FROM t RETURNING id")
        .fetch_all::<i64>()
        .await
        .unwrap();
    client.ping().await.unwrap();
    assert_eq!(
        hits(&server).await,
        6,
        "every request matched the JSON content type"
    );
}

/// A loopback port with nothing listening.
async fn closed_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

#[tokio::test]
async fn a_refused_connection_was_not_sent_and_keeps_its_cause() {
    let client = Client::builder(closed_port().await)
        .retry(quick(2))
        .retry_writes(true)
        .build()
        .unwrap();
    let err = client.insert("events", &events(1)).await.unwrap_err();
    assert!(err.is_connection() && err.is_retryable(), "{err:?}");
    assert_eq!(err.attempts(), 2);
    assert!(!err.is_sent() && !err.is_outcome_unknown(), "{err:?}");
    assert_eq!(err.idempotency_key(), None);
    let source = err.source().expect("the HTTP stack's error");
    let reqwest_err = source
        .downcast_ref::<reqwest::Error>()
        .expect("a reqwest::Error");
    assert!(reqwest_err.is_connect());
    // The chain goes down to the operating system's refusal.
    let mut chain = Vec::new();
    let mut cause: Option<&dyn std::error::Error> = Some(&err);
    while let Some(c) = cause {
        chain.push(c.to_string());
        cause = c.source();
    }
    assert!(chain.len() >= 3, "{chain:?}");
}

#[tokio::test]
async fn an_answered_request_was_sent() {
    let server = server().await;
    respond_always(&server, error(400, "SQL_ERROR", "no such table: t")).await;
    let client = builder(&server).build().unwrap();
    let err = client.execute("DELETE FROM t").await.unwrap_err();
    assert!(err.is_sent() && !err.is_outcome_unknown());
    assert!(
        err.source().is_none(),
        "a protocol error has no deeper cause"
    );
}

#[tokio::test]
async fn a_decode_failure_hides_the_cell_everywhere_in_its_chain() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(&["n"], &json!([[1], ["cell-secret@example.com"]])),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let err = client
        .query("SELECT n")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Decode { row: Some(1), .. }),
        "{err:?}"
    );
    // The JSON parser's error quotes the cell: a caller logging the chain must not log it.
    assert!(err.source().is_none(), "{err:?}");
    for text in [
        err.to_string(),
        format!("{err:?}"),
        format!("{:?}", err.kind()),
    ] {
        assert!(!text.contains("cell-secret"), "{text}");
        assert!(text.contains("expected i64"), "{text}");
        assert!(text.contains("decoding into `i64`"), "{text}");
        assert!(!text.contains("at line"), "{text}");
    }
    // Through the table too.
    let table = client.query_table("SELECT n").await.unwrap();
    let err = table.row(1).unwrap().get::<i64>("n").unwrap_err();
    assert!(!format!("{err} {err:?}").contains("cell-secret"), "{err:?}");
    assert!(err.source().is_none(), "{err:?}");
    assert!(!format!("{table:?}").contains("cell-secret"), "{table:?}");
    assert!(!format!("{:?}", table.row(1).unwrap()).contains("cell-secret"));
}

#[test]
fn no_builders_debug_prints_a_bound_value_or_a_row() {
    let client = Client::builder("http://127.0.0.1:9").build().unwrap();
    let rows = events(3);
    let texts = [
        format!("{:?}", client.query("SELECT ?").bind("param-secret")),
        format!("{:?}", client.query_table("SELECT ?").bind("param-secret")),
        format!("{:?}", client.execute("DELETE ?").bind("param-secret")),
        format!(
            "{:?}",
            client.insert("events", &rows).idempotency_key("k-1")
        ),
        format!("{:?}", client.insert("events", &rows).into_future_debug()),
    ];
    for text in &texts {
        assert!(
            !text.contains("param-secret") && !text.contains("row-secret"),
            "{text}"
        );
    }
    assert!(texts[3].contains("<3 rows>"), "{}", texts[3]);
}

/// `.await` turns a builder into a named, `Send` future that can be stored.
trait IntoFutureDebug: std::future::IntoFuture + Sized {
    fn into_future_debug(self) -> Self::IntoFuture {
        self.into_future()
    }
}
impl<T: std::future::IntoFuture> IntoFutureDebug for T {}

#[test]
fn transport_settings_build_and_refuse_a_caller_supplied_client() {
    let client = Client::builder("https://db.example.com")
        .connect_timeout(Duration::from_secs(2))
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_keepalive(None)
        .proxy(sqlhttp::Proxy::all("http://127.0.0.1:3128").unwrap())
        .build();
    assert!(
        client.is_ok(),
        "https with the default TLS feature: {client:?}"
    );
    let err = Client::builder("http://db.example.com")
        .http_client(plain_http())
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("http_client"), "{err}");
}
