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
        .bookmark(bookmark("0000000000000500"))
        .build()
        .unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000500")));
    read(&client).await;
    // A greater bookmark for one call is sent on that call...
    client
        .query("SELECT 1")
        .bookmark(bookmark("0000000000000900"))
        .fetch_all::<i64>()
        .await
        .unwrap();
    // ...a lesser one does not lower what is sent...
    client
        .query_table("SELECT 1")
        .bookmark(bookmark("0000000000000001"))
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
    let empty = builder(&server).bookmark(None).build().unwrap();
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
        .bookmark(bookmark("0000000000000600"))
        .build()
        .unwrap();
    client
        .query("SELECT 1")
        .bookmark(bookmark("0000000000000650"))
        .consistency(Consistency::AnyReplica)
        .fetch_all::<i64>()
        .await
        .unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000700")));
    client
        .batch()
        .statement("SELECT 1")
        .read_only(true)
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
        .bookmark(bookmark("0000000000000042"))
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
        .bookmark(bookmark("0000000000000111"))
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

/// A server whose primary is behind any bookmark: `409 BOOKMARK_AHEAD` to a request carrying one,
/// `answer` to one without.
struct BehindAnyBookmark(ResponseTemplate);

impl Respond for BehindAnyBookmark {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if request.headers.contains_key(BOOKMARK) {
            error(
                409,
                "BOOKMARK_AHEAD",
                "the bookmark is past this primary's log",
            )
        } else {
            self.0.clone()
        }
    }
}

async fn behind(server: &MockServer, route: &str, answer: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(BehindAnyBookmark(answer))
        .mount(server)
        .await;
}

const FAR: &str = "00000000ffff0000";

#[tokio::test(start_paused = true)]
async fn a_read_refused_for_a_bookmark_ahead_drops_it_and_is_sent_again_without_it() {
    let server = server().await;
    behind(&server, "/api/v1/sql", rows_at("0000000000000010")).await;
    let client = builder(&server)
        .bookmark(bookmark(FAR))
        .retry(sqlhttp::RetryPolicy::never())
        .build()
        .unwrap();
    let clone = client.clone();
    assert_eq!(read(&client).await, Some(bookmark("0000000000000010")));
    assert_eq!(header_values(&server, BOOKMARK).await, [FAR, ""]);
    // A free attempt, even under a policy of one.
    assert_eq!(attempt_headers(&server).await, ["1/1", "2/2"]);
    // The clones share the session: theirs is dropped too.
    assert_eq!(clone.bookmark(), Some(bookmark("0000000000000010")));
}

#[tokio::test(start_paused = true)]
async fn a_call_s_own_bookmark_ahead_is_dropped_for_its_next_attempt() {
    let server = server().await;
    behind(&server, "/api/v1/sql", ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server).build().unwrap();
    client
        .query("SELECT 1")
        .bookmark(bookmark(FAR))
        .fetch_all::<i64>()
        .await
        .unwrap();
    assert_eq!(header_values(&server, BOOKMARK).await, [FAR, ""]);
}

#[tokio::test(start_paused = true)]
async fn keyed_writes_and_transaction_steps_are_sent_again_without_it() {
    #[derive(Serialize)]
    struct Row {
        n: i64,
    }
    let server = server().await;
    let effect = json!({"columns": [], "rows": [], "rows_affected": 1, "last_insert_id": null});
    behind(
        &server,
        "/api/v1/sql",
        ResponseTemplate::new(200).set_body_json(effect.clone()),
    )
    .await;
    behind(
        &server,
        "/api/v1/transaction/open",
        ResponseTemplate::new(200).set_body_json(json!({"transaction": "tx1"})),
    )
    .await;
    behind(
        &server,
        "/api/v1/transaction/statement",
        ResponseTemplate::new(200).set_body_json(effect),
    )
    .await;
    behind(
        &server,
        "/api/v1/transaction/commit",
        ResponseTemplate::new(200).set_body_json(json!({"outcome": "committed"})),
    )
    .await;
    // Without retry_writes: the write is refused before it ran, so it is sent again all the same.
    let client = builder(&server).bookmark(bookmark(FAR)).build().unwrap();
    assert_eq!(client.insert("t", &[Row { n: 1 }]).await.unwrap(), 1);
    let keys = header_values(&server, "idempotency-key").await;
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "one key on both attempts");

    // Each step in turn meets the bookmark: the open, a statement, the COMMIT.
    for step in ["open", "statement", "commit"] {
        client.reset_bookmark();
        let far = || client.observe_bookmark(bookmark(FAR));
        if step == "open" {
            far();
        }
        let tx = client.transaction().await.unwrap();
        if step == "statement" {
            far();
        }
        tx.execute("UPDATE t SET n = 3").await.unwrap();
        if step == "commit" {
            far();
        }
        tx.commit().await.unwrap();
        assert_eq!(client.bookmark(), None, "{step}");
    }
    let refused = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.headers.contains_key(BOOKMARK))
        .map(|r| r.url.path().to_owned())
        .collect::<Vec<_>>();
    assert_eq!(
        refused,
        [
            "/api/v1/sql",
            "/api/v1/transaction/open",
            "/api/v1/transaction/statement",
            "/api/v1/transaction/commit",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_execute_refused_for_its_bookmark_returns_the_error_and_its_next_call_goes_without() {
    let server = server().await;
    behind(
        &server,
        "/api/v1/sql",
        ok_effect(1, None).insert_header(BOOKMARK, "0000000000000020"),
    )
    .await;
    let client = builder(&server).bookmark(bookmark(FAR)).build().unwrap();
    let err = client.execute("UPDATE t SET n = 1").await.unwrap_err();
    assert!(
        matches!(err.kind(), sqlhttp::ErrorKind::BookmarkAhead { .. }),
        "{err:?}"
    );
    assert!(!err.is_outcome_unknown(), "nothing ran: {err:?}");
    assert_eq!(hits(&server).await, 1, "an execute is never sent twice");
    assert_eq!(client.bookmark(), None);
    client.execute("UPDATE t SET n = 1").await.unwrap();
    assert_eq!(header_values(&server, BOOKMARK).await, [FAR, ""]);
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000020")));
}

#[tokio::test(start_paused = true)]
async fn reset_bookmark_forgets_it_for_every_clone() {
    let server = server().await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server)
        .bookmark(bookmark("0000000000000042"))
        .build()
        .unwrap();
    let clone = client.clone();
    clone.reset_bookmark();
    assert_eq!(client.bookmark(), None);
    read(&client).await;
    assert_eq!(header_values(&server, BOOKMARK).await, [""]);
}

/// A success body that names its bookmark at its end, after `last_insert_id` (a write that
/// committed after its headers were sent).
fn ending_with(bookmark: &str) -> ResponseTemplate {
    let body = format!(
        r#"{{"columns":[{{"name":"id","type":"INTEGER"}}],"rows":[[1],[2]],"rows_affected":2,"last_insert_id":2,"bookmark":{bookmark}}}"#
    );
    ResponseTemplate::new(200).set_body_raw(body, "application/json")
}

#[tokio::test(start_paused = true)]
async fn a_body_s_bookmark_is_taken_on_every_buffered_call() {
    let server = server().await;
    respond_times(&server, ending_with(r#""0000000000000100""#), 1).await;
    respond_times(&server, ending_with(r#""0000000000000200""#), 1).await;
    respond_times(&server, ending_with(r#""0000000000000300""#), 1).await;
    // A header and a body that both name one: the greater is kept.
    respond_times(
        &server,
        ending_with(r#""0000000000000400""#).insert_header(BOOKMARK, "0000000000000350"),
        1,
    )
    .await;
    let client = builder(&server).build().unwrap();
    let effect = client
        .execute("INSERT INTO t VALUES (1), (2)")
        .await
        .unwrap();
    assert_eq!(effect.rows_affected, 2);
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000100")));
    let ids: Vec<i64> = client
        .execute("INSERT INTO t VALUES (1), (2) RETURNING id")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(ids, [1, 2]);
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000200")));
    client.query_table("SELECT id FROM t").await.unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000300")));
    client.execute("UPDATE t SET n = 1").await.unwrap();
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000400")));
}

#[tokio::test(start_paused = true)]
async fn a_streamed_body_s_bookmark_is_taken_at_its_end() {
    let server = server().await;
    respond_times(&server, ending_with(r#""0000000000000100""#), 1).await;
    respond_times(&server, ending_with(r#""0000000000000200""#), 1).await;
    respond_times(&server, ending_with(r#""0000000000000300""#), 1).await;
    let client = builder(&server).build().unwrap();
    let mut rows = client
        .execute("INSERT INTO t VALUES (1), (2) RETURNING id")
        .fetch::<i64>();
    let mut ids = Vec::new();
    while let Some(id) = rows.try_next().await.unwrap() {
        ids.push(id);
    }
    assert_eq!(ids, [1, 2]);
    assert_eq!(rows.rows_affected(), Some(2));
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000100")));
    // The first row only: the rest is read past to its end.
    let id: i64 = client
        .execute("INSERT INTO t VALUES (1), (2) RETURNING id")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(id, 1);
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000200")));
    let id: Option<i64> = client
        .execute("INSERT INTO t VALUES (1), (2) RETURNING id")
        .fetch_optional()
        .await
        .unwrap();
    assert_eq!(id, Some(1));
    assert_eq!(client.bookmark(), Some(bookmark("0000000000000300")));
}

#[tokio::test(start_paused = true)]
async fn an_ill_formed_or_older_body_bookmark_changes_nothing_and_fails_nothing() {
    let server = server().await;
    for member in [
        r#""0/16B3A28""#,
        r#""16b3a28""#,
        "null",
        "42",
        r#"{"lsn":"0000000000000900"}"#,
        r#""0000000000000001""#,
    ] {
        respond_times(&server, ending_with(member), 2).await;
    }
    let client = builder(&server)
        .bookmark(bookmark("0000000000000500"))
        .build()
        .unwrap();
    for _ in 0..6 {
        client
            .execute("INSERT INTO t VALUES (1), (2)")
            .await
            .unwrap();
        let mut rows = client.query("SELECT id FROM t").fetch::<i64>();
        while rows.try_next().await.unwrap().is_some() {}
        assert_eq!(client.bookmark(), Some(bookmark("0000000000000500")));
    }
}
