//! Bookmarks against wiremock: the client keeps the greatest `Sqlhttp-Bookmark` any answer carried
//! (on every endpoint, shared by clones), sends it on every request and every retried attempt, takes
//! a start value from the builder and a raise per call, and asks for any replica or the primary as a
//! read's `Consistency` says. A malformed header or none at all changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;
use serde_json::json;
use sqlhttp::{Bookmark, Client, Consistency};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::*;

const BOOKMARK: &str = "sqlhttp-bookmark";
const CONSISTENCY: &str = "sqlhttp-consistency";

fn bookmark(text: &str) -> Bookmark {
    text.parse().unwrap()
}

/// A row answer carrying `bookmark` as its `Sqlhttp-Bookmark` header.
fn rows_at(bookmark: &str) -> ResponseTemplate {
    ok_rows(&["n"], &json!([[1]])).insert_header(BOOKMARK, bookmark)
}

/// Mounts `response` for the next `times` requests to `route` (in mount order).
async fn mount(server: &MockServer, route: &str, response: ResponseTemplate, times: u64) {
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(response)
        .up_to_n_times(times)
        .mount(server)
        .await;
}

/// Runs one read and returns the client's bookmark after it.
async fn read(client: &Client) -> Option<Bookmark> {
    client.query("SELECT 1").fetch_all::<i64>().await.unwrap();
    client.bookmark()
}

#[tokio::test(start_paused = true)]
async fn the_greatest_bookmark_is_kept_whatever_order_the_answers_come_in() {
    let server = server().await;
    for text in [
        "0000000000000200",
        "0000000000000100",
        "0000000000000300",
        "00000000000002ff",
    ] {
        respond_times(&server, rows_at(text), 1).await;
    }
    let client = builder(&server).build().unwrap();
    assert_eq!(client.bookmark(), None);
    let seen = [
        read(&client).await,
        read(&client).await,
        read(&client).await,
        read(&client).await,
    ];
    let expected = [
        "0000000000000200",
        "0000000000000200",
        "0000000000000300",
        "0000000000000300",
    ];
    assert_eq!(seen, expected.map(|text| Some(bookmark(text))));
    // Each request carried the greatest known when it was sent; the first, none.
    assert_eq!(
        header_values(&server, BOOKMARK).await,
        [
            "",
            "0000000000000200",
            "0000000000000200",
            "0000000000000300"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn clones_share_one_session() {
    let server = server().await;
    respond_times(&server, rows_at("00000000000000a0"), 1).await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server).build().unwrap();
    let clone = client.clone();
    read(&clone).await;
    assert_eq!(client.bookmark(), Some(bookmark("00000000000000a0")));
    // The original sends what its clone saw.
    read(&client).await;
    assert_eq!(
        header_values(&server, BOOKMARK).await,
        ["", "00000000000000a0"]
    );
    // And what is merged into one is seen by the other.
    client.observe_bookmark(bookmark("00000000000000b0"));
    assert_eq!(clone.bookmark(), Some(bookmark("00000000000000b0")));
    // An older one changes nothing.
    clone.observe_bookmark(bookmark("0000000000000001"));
    assert_eq!(client.bookmark(), Some(bookmark("00000000000000b0")));
}

#[tokio::test(start_paused = true)]
async fn every_endpoint_s_answer_raises_it_and_every_request_carries_it() {
    #[derive(Serialize)]
    struct Row {
        n: i64,
    }
    let server = server().await;
    let at = |text: &str, body: serde_json::Value| {
        ResponseTemplate::new(200)
            .set_body_json(body)
            .insert_header(BOOKMARK, text)
    };
    let effect = json!({"columns": [], "rows": [], "rows_affected": 1, "last_insert_id": null});
    // A statement, an insert, a batch, and an interactive transaction's steps.
    mount(
        &server,
        "/api/v1/sql",
        at("0000000000000010", effect.clone()),
        1,
    )
    .await;
    mount(
        &server,
        "/api/v1/sql",
        at("0000000000000020", effect.clone()),
        1,
    )
    .await;
    mount(
        &server,
        "/api/v1/batch",
        at("0000000000000030", json!({"results": [effect.clone()]})),
        1,
    )
    .await;
    mount(
        &server,
        "/api/v1/transaction/open",
        ResponseTemplate::new(200).set_body_json(json!({"transaction": "tx1"})),
        1,
    )
    .await;
    mount(
        &server,
        "/api/v1/transaction/statement",
        at("0000000000000040", effect.clone()),
        1,
    )
    .await;
    mount(
        &server,
        "/api/v1/transaction/commit",
        at("0000000000000050", json!({})),
        1,
    )
    .await;
    let client = builder(&server).build().unwrap();

    client.execute("UPDATE t SET n = 1").await.unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000010")));
    client.insert("t", &[Row { n: 1 }]).await.unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000020")));
    client
        .batch()
        .statement("UPDATE t SET n = 2")
        .await
        .unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000030")));
    let tx = client.transaction().await.unwrap();
    tx.execute("UPDATE t SET n = 3").await.unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000040")));
    tx.commit().await.unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000050")));

    let sent: Vec<(String, String)> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let header = r.headers.get(BOOKMARK).map(|v| v.to_str().unwrap());
            (r.url.path().to_owned(), header.unwrap_or("").to_owned())
        })
        .collect();
    let expected = [
        ("/api/v1/sql", ""),
        ("/api/v1/sql", "0000000000000010"),
        ("/api/v1/batch", "0000000000000020"),
        ("/api/v1/transaction/open", "0000000000000030"),
        ("/api/v1/transaction/statement", "0000000000000030"),
        ("/api/v1/transaction/commit", "0000000000000040"),
    ];
    assert_eq!(
        sent,
        expected.map(|(route, header)| (route.to_owned(), header.to_owned()))
    );
}

#[tokio::test(start_paused = true)]
async fn the_builder_starts_the_session_and_a_call_raises_it_for_itself_only() {
    let server = server().await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server)
        .with_bookmark(bookmark("0000000000000500"))
        .build()
        .unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000500")));
    read(&client).await;
    // A greater bookmark for one call is sent on that call...
    client
        .query("SELECT 1")
        .with_bookmark(bookmark("0000000000000900"))
        .fetch_all::<i64>()
        .await
        .unwrap();
    // ...a lesser one does not lower what is sent...
    client
        .query_table("SELECT 1")
        .with_bookmark(bookmark("0000000000000001"))
        .await
        .unwrap();
    // ...and neither changes the session (these answers carry none).
    assert_eq!(read(&client).await, Some(bookmark("0000000000000500")));
    assert_eq!(
        header_values(&server, BOOKMARK).await,
        [
            "0000000000000500",
            "0000000000000900",
            "0000000000000500",
            "0000000000000500"
        ]
    );
    // The builder's `None` starts empty.
    let empty = builder(&server).with_bookmark(None).build().unwrap();
    assert_eq!(empty.bookmark(), None);
}

#[tokio::test(start_paused = true)]
async fn any_replica_sends_no_bookmark_but_keeps_the_answer_s() {
    let server = server().await;
    respond_times(&server, rows_at("0000000000000700"), 1).await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let results = json!({"results": [rows_body(&["n"], &json!([[1]]))]});
    let batch = ResponseTemplate::new(200).set_body_json(results);
    mount(&server, "/api/v1/batch", batch, 1).await;
    let client = builder(&server)
        .with_bookmark(bookmark("0000000000000600"))
        .build()
        .unwrap();
    client
        .query("SELECT 1")
        .with_bookmark(bookmark("0000000000000650"))
        .consistency(Consistency::AnyReplica)
        .fetch_all::<i64>()
        .await
        .unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000700")));
    client
        .batch()
        .statement("SELECT 1")
        .read_only()
        .consistency(Consistency::AnyReplica)
        .await
        .unwrap();
    let requests = server.received_requests().await.unwrap();
    assert!(
        requests
            .iter()
            .all(|r| r.headers.get(BOOKMARK).is_none() && r.headers.get(CONSISTENCY).is_none()),
        "{:?}",
        requests.iter().map(|r| &r.headers).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn primary_sends_the_consistency_header_and_session_sends_none() {
    let server = server().await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server)
        .with_bookmark(bookmark("0000000000000042"))
        .build()
        .unwrap();
    client
        .query("SELECT 1")
        .consistency(Consistency::Primary)
        .fetch_all::<i64>()
        .await
        .unwrap();
    client
        .query("SELECT 1")
        .consistency(Consistency::Session)
        .fetch_all::<i64>()
        .await
        .unwrap();
    read(&client).await;
    assert_eq!(
        header_values(&server, CONSISTENCY).await,
        ["primary", "", ""]
    );
    assert_eq!(
        header_values(&server, BOOKMARK).await,
        ["0000000000000042"; 3]
    );
}

#[tokio::test(start_paused = true)]
async fn a_malformed_header_or_none_leaves_the_session_unchanged() {
    let server = server().await;
    respond_times(&server, rows_at("0000000000000abc"), 1).await;
    for malformed in [
        "0/16B3748",
        "not-a-bookmark",
        "",
        "00000000000000001",
        "ffffffffffffffff0",
    ] {
        respond_times(&server, rows_at(malformed), 1).await;
    }
    respond_times(&server, ok_rows(&["n"], &json!([[1]])), 1).await;
    let client = builder(&server).build().unwrap();
    for _ in 0..7 {
        assert_eq!(read(&client).await, Some(bookmark("0000000000000abc")));
    }
    // Upper case is a valid bookmark, taken as the same position.
    respond_times(&server, rows_at("0000000000000ABD"), 1).await;
    assert_eq!(read(&client).await, Some(bookmark("0000000000000abd")));
    assert_eq!(
        header_values(&server, BOOKMARK).await.last().unwrap(),
        "0000000000000abc"
    );
}

/// Fails the first attempt with a 503 after another part of the application saw a later bookmark,
/// then answers.
struct RaisedDuringTheFirstAttempt {
    client: Client,
    calls: AtomicUsize,
}

impl Respond for RaisedDuringTheFirstAttempt {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.client.observe_bookmark(bookmark("0000000000000222"));
            error(503, "UNAVAILABLE", "busy")
        } else {
            rows_at("0000000000000333")
        }
    }
}

#[tokio::test(start_paused = true)]
async fn each_retried_attempt_carries_the_greatest_bookmark_known_when_it_is_sent() {
    let server = server().await;
    let client = builder(&server)
        .with_bookmark(bookmark("0000000000000111"))
        .build()
        .unwrap();
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .respond_with(RaisedDuringTheFirstAttempt {
            client: client.clone(),
            calls: AtomicUsize::new(0),
        })
        .mount(&server)
        .await;
    read(&client).await;
    assert_eq!(attempt_headers(&server).await, ["1/3", "2/3"]);
    assert_eq!(
        header_values(&server, BOOKMARK).await,
        ["0000000000000111", "0000000000000222"]
    );
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000333")));
}

#[tokio::test(start_paused = true)]
async fn a_failed_answer_s_bookmark_is_not_taken() {
    let server = server().await;
    respond_times(
        &server,
        error(400, "SQL_ERROR", "no such table").insert_header(BOOKMARK, "0000000000000999"),
        1,
    )
    .await;
    let client = builder(&server).build().unwrap();
    client
        .query("SELECT * FROM nowhere")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!(client.bookmark(), None);
}

#[test]
fn a_bookmark_travels_as_its_string() {
    let b = bookmark("00000000016A0010");
    assert_eq!(b.to_string(), "00000000016a0010");
    assert_eq!(serde_json::to_value(b).unwrap(), json!("00000000016a0010"));
    let back: Bookmark = serde_json::from_value(json!("00000000016a0010")).unwrap();
    assert_eq!(back, b);
    let err = "16A0010".parse::<Bookmark>().unwrap_err();
    assert!(err.to_string().contains("16 hexadecimal digits"), "{err}");
}
