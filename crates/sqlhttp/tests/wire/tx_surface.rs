//! A transaction's statements are the client's builders (ADR 0047): awaiting them means what it
//! means on the client, per-call settings apply (or fail before sending when they cannot), an
//! insert runs as steps, one function written against `Executor` runs on both, `transact` keeps
//! a decision its work made, and a streamed step whose answer is cut short reads the stored
//! result again, past the rows it gave.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sqlhttp::{Client, ErrorKind, Executor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::*;

const OPEN: &str = "/api/v1/transaction/open";
const STATEMENT: &str = "/api/v1/transaction/statement";
const COMMIT: &str = "/api/v1/transaction/commit";
const ROLLBACK: &str = "/api/v1/transaction/rollback";

async fn on(server: &MockServer, route: &str, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(response)
        .mount(server)
        .await;
}

/// The bodies of the requests that reached `route`, in order.
async fn bodies(server: &MockServer, route: &str) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == route)
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

/// A transaction server: opens answer `tx1`, statements `statement`, COMMIT and ROLLBACK succeed.
async fn tx_server(statement: ResponseTemplate) -> MockServer {
    let server = server().await;
    on(
        &server,
        OPEN,
        ResponseTemplate::new(200).set_body_json(json!({"transaction": "tx1"})),
    )
    .await;
    on(&server, STATEMENT, statement).await;
    on(
        &server,
        COMMIT,
        ResponseTemplate::new(200).set_body_json(json!({"outcome": "committed"})),
    )
    .await;
    on(
        &server,
        ROLLBACK,
        ResponseTemplate::new(200).set_body_json(json!({"outcome": "rolled_back"})),
    )
    .await;
    server
}

#[tokio::test(start_paused = true)]
async fn awaiting_a_transaction_s_execute_gives_its_effect_as_on_the_client() {
    let server = tx_server(ok_effect(3, Some(9))).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let effect = tx.execute("UPDATE t SET n = 1").await.unwrap();
    assert_eq!((effect.rows_affected, effect.last_insert_id), (3, Some(9)));
    let table = tx.query_table("SELECT 1").await.unwrap();
    assert_eq!(table.rows_affected(), 3);
    tx.commit().await.unwrap();
    let sent = bodies(&server, STATEMENT).await;
    assert_eq!(sent[0]["seq"], 1);
    assert_eq!(sent[1]["seq"], 2);
    assert_eq!(sent[0]["transaction"], "tx1");
    assert_eq!(sent[0]["sql"], "UPDATE t SET n = 1");
}

#[tokio::test(start_paused = true)]
async fn a_transaction_s_query_fetches_streams_and_decodes_like_the_client_s() {
    let server = tx_server(ok_rows(&["id", "name"], &json!([[1, "a"], [2, "b"]]))).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let all: Vec<(i64, String)> = tx
        .query("SELECT id, name FROM t")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(all, vec![(1, "a".to_owned()), (2, "b".to_owned())]);
    let one: (i64, String) = tx
        .query("SELECT id, name FROM t")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(one.0, 1);
    let mut rows = tx
        .query("SELECT id, name FROM t")
        // A per-call setting, as on the client's (off: the paused clock would jump to it).
        .timeout(None)
        .fetch::<(i64, String)>()
        .await
        .unwrap();
    assert_eq!(rows.columns().len(), 2);
    let mut streamed = Vec::new();
    while let Some((id, _)) = rows.try_next().await.unwrap() {
        streamed.push(id);
    }
    assert_eq!(streamed, [1, 2]);
    let returned: Vec<i64> = tx
        .execute("DELETE FROM t RETURNING id")
        .fetch_all::<(i64, String)>()
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.0)
        .collect();
    assert_eq!(returned, [1, 2]);
    tx.commit().await.unwrap();
    let seqs: Vec<Value> = bodies(&server, STATEMENT)
        .await
        .iter()
        .map(|b| b["seq"].clone())
        .collect();
    assert_eq!(seqs, [json!(1), json!(2), json!(3), json!(4)]);
}

#[tokio::test(start_paused = true)]
async fn settings_that_cannot_apply_in_a_transaction_fail_before_sending_and_it_goes_on() {
    let server = tx_server(ok_effect(1, None)).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let err = tx
        .query("SELECT 1")
        .consistency(sqlhttp::Consistency::Primary)
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    let err = tx
        .insert("t", &[json!({"a": 1})])
        .idempotency_key("mine")
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    // A call cancelled before it was sent: nothing ran, the transaction goes on.
    let token = sqlhttp::CancellationToken::new();
    token.cancel();
    let err = tx
        .execute("DELETE FROM t")
        .cancel_on(&token)
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Cancelled), "{err:?}");
    assert!(!err.is_outcome_unknown(), "{err:?}");
    assert!(bodies(&server, STATEMENT).await.is_empty(), "nothing sent");
    tx.execute("DELETE FROM t").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(bodies(&server, STATEMENT).await[0]["seq"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_transaction_s_insert_runs_its_statements_as_steps() {
    let server = tx_server(ok_effect(2, None)).await;
    let client = builder(&server).insert_max_params(2).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let rows = [
        json!({"a": 1}),
        json!({"a": 2}),
        json!({"a": 3}),
        json!({"a": 4}),
    ];
    let inserted = tx.insert("t", &rows).atomic(true).await.unwrap();
    assert_eq!(inserted, 4);
    tx.commit().await.unwrap();
    let sent = bodies(&server, STATEMENT).await;
    assert_eq!(sent.len(), 2, "two statements, each a step: {sent:?}");
    assert_eq!(
        (sent[0]["seq"].clone(), sent[1]["seq"].clone()),
        (json!(1), json!(2))
    );
    assert_eq!(sent[0]["params"], json!([1, 2]));
    let batches = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() != STATEMENT && r.url.path() != OPEN && r.url.path() != COMMIT)
        .count();
    assert_eq!(batches, 0, "no batch and no plain statement");
}

/// Written once, for the client and a transaction alike.
async fn count_rows(db: impl Executor<'_>) -> sqlhttp::Result<i64> {
    db.execute("INSERT INTO t VALUES (1)").await?;
    db.query("SELECT count(*) FROM t").fetch_one().await
}

#[tokio::test(start_paused = true)]
async fn one_function_against_executor_runs_on_the_client_and_in_a_transaction() {
    let server = tx_server(ok_rows(&["n"], &json!([[5]]))).await;
    on(&server, "/api/v1/sql", ok_rows(&["n"], &json!([[5]]))).await;
    let client = builder(&server).build().unwrap();
    assert_eq!(count_rows(&client).await.unwrap(), 5);
    let mut tx = client.transaction().await.unwrap();
    assert_eq!(count_rows(&tx).await.unwrap(), 5);
    assert_eq!(count_rows(&mut tx).await.unwrap(), 5);
    tx.commit().await.unwrap();
    assert_eq!(bodies(&server, "/api/v1/sql").await.len(), 2);
    assert_eq!(bodies(&server, STATEMENT).await.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn transact_keeps_the_work_s_own_rollback_or_commit() {
    let server = tx_server(ok_effect(1, None)).await;
    let client: Client = builder(&server).build().unwrap();
    let kept = client
        .transact(|tx| async move {
            tx.execute("DELETE FROM t").await?;
            tx.rollback().await?;
            Ok("rolled back")
        })
        .await
        .unwrap();
    assert_eq!(kept, "rolled back");
    assert_eq!(bodies(&server, COMMIT).await.len(), 0, "never committed");
    assert_eq!(bodies(&server, ROLLBACK).await.len(), 1);
    client
        .transact(|tx| async move { tx.commit().await })
        .await
        .unwrap();
    assert_eq!(bodies(&server, COMMIT).await.len(), 1, "committed once");
}

/// A server on a socket of the test's own, answering one request per connection: the `i`th
/// answer to a transaction statement is cut after `cuts[i]` bytes of its body (the connection
/// closes), later ones are whole. Returns its URL and the statement bodies it received.
async fn cutting_server(result: Vec<u8>, cuts: &[usize]) -> (String, Arc<Mutex<Vec<Value>>>) {
    let cuts = cuts.to_vec();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&received);
    tokio::spawn(async move {
        let mut statements = 0;
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            let (head_end, length) = loop {
                let n = socket.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
                if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    break (end + 4, length);
                }
            };
            while request.len() < head_end + length {
                let n = socket.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
            }
            let line = String::from_utf8_lossy(&request[..head_end]).into_owned();
            let body = &request[head_end..head_end + length];
            let (answer, cut_at): (Vec<u8>, Option<usize>) = if line.contains(OPEN) {
                (br#"{"transaction":"tx1"}"#.to_vec(), None)
            } else if line.contains(STATEMENT) {
                seen.lock()
                    .unwrap()
                    .push(serde_json::from_slice(body).unwrap());
                statements += 1;
                (result.clone(), cuts.get(statements - 1).copied())
            } else {
                (br#"{"outcome":"committed"}"#.to_vec(), None)
            };
            let replayed = if statements > 1 && line.contains(STATEMENT) {
                "Idempotent-Replayed: true\r\n"
            } else {
                ""
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{replayed}Connection: close\r\n\r\n",
                answer.len()
            );
            socket.write_all(head.as_bytes()).await.unwrap();
            let sent = cut_at.unwrap_or(answer.len());
            socket.write_all(&answer[..sent]).await.unwrap();
            socket.flush().await.unwrap();
            drop(socket);
        }
    });
    (url, received)
}

fn rows_result(n: i64) -> Vec<u8> {
    let rows: Vec<Value> = (1..=n).map(|i| json!([i])).collect();
    serde_json::to_vec(&json!({
        "columns": [{"name": "n", "type": "INTEGER"}],
        "rows": rows,
        "rows_affected": 0,
        "last_insert_id": null,
    }))
    .unwrap()
}

/// The answer of a streamed step is cut part-way: the stream sends the step again under the
/// same number, skips the rows it gave, and ends with every row once, in order.
#[tokio::test]
async fn a_streamed_step_cut_short_reads_its_stored_result_again_past_the_rows_given() {
    let result = rows_result(2_000);
    let (url, received) = cutting_server(result.clone(), &[result.len() / 2]).await;
    let client = Client::builder(url)
        .http_client(plain_http())
        .retry(sqlhttp::RetryPolicy::new().with_jitter_seed(7))
        .build()
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let mut rows = tx.query("SELECT n FROM t").fetch::<i64>();
    let mut got = Vec::new();
    while let Some(n) = rows.try_next().await.unwrap() {
        got.push(n);
    }
    assert_eq!(
        got,
        (1..=2_000).collect::<Vec<_>>(),
        "every row once, in order"
    );
    drop(rows);
    tx.commit().await.unwrap();
    let sent = received.lock().unwrap().clone();
    assert_eq!(sent.len(), 2, "sent once more: {sent:?}");
    assert_eq!(sent[0], sent[1], "the same statement under the same number");
    assert_eq!(sent[1]["seq"], 1);
}

/// Once a later statement has been sent, the server no longer keeps the streamed one's result:
/// the cut stream ends with an error, never with a short result taken for a whole one.
#[tokio::test]
async fn a_cut_stream_whose_result_is_no_longer_kept_ends_with_an_error() {
    let result = rows_result(2_000);
    let (url, received) = cutting_server(result.clone(), &[result.len() / 2]).await;
    let client = Client::builder(url)
        .http_client(plain_http())
        .build()
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let mut rows = tx.query("SELECT n FROM t").fetch::<i64>().await.unwrap();
    // The next statement goes first (the stream holds nothing of the transaction).
    tx.query("SELECT n FROM t")
        .fetch_one::<i64>()
        .await
        .unwrap();
    let mut got = 0;
    let err = loop {
        match rows.try_next().await {
            Ok(Some(_)) => got += 1,
            Ok(None) => panic!("a cut result ended cleanly after {got} rows"),
            Err(err) => break err,
        }
    };
    assert!(got < 2_000, "{got}");
    assert!(err.to_string().contains("cannot be read again"), "{err}");
    assert_eq!(received.lock().unwrap().len(), 2, "not sent again");
    drop(rows);
    tx.rollback().await.unwrap();
}

/// Dropping an unfinished transaction rolls it back, once the builders and streams it made are
/// gone too; a builder made before the end and awaited after it fails without being sent.
#[tokio::test]
async fn a_dropped_transaction_rolls_back_and_a_builder_outliving_the_end_is_not_sent() {
    let server = tx_server(ok_effect(1, None)).await;
    let client = builder(&server).build().unwrap();

    let tx = client.transaction().await.unwrap();
    tx.execute("DELETE FROM t").await.unwrap();
    let late = tx.execute("DELETE FROM u");
    drop(tx);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        bodies(&server, ROLLBACK).await.len(),
        0,
        "a builder still holds the transaction"
    );
    drop(late);
    let mut waited = 0;
    while bodies(&server, ROLLBACK).await.is_empty() && waited < 50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(
        bodies(&server, ROLLBACK).await,
        [json!({"transaction": "tx1"})]
    );
    assert_eq!(bodies(&server, COMMIT).await.len(), 0);

    let tx = client.transaction().await.unwrap();
    let late = tx.execute("DELETE FROM u");
    tx.commit().await.unwrap();
    let err = late.await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("has ended"), "{err}");
    assert_eq!(bodies(&server, STATEMENT).await.len(), 1, "not sent");
}

/// A streamed step keeps a step's retry rules: every attempt answered `504` by a gateway leaves
/// its outcome unknown, which ends the transaction (rolled back, its COMMIT never sent), as for
/// a buffered one.
#[tokio::test(start_paused = true)]
async fn a_streamed_step_whose_outcome_is_unknown_ends_the_transaction_as_a_buffered_one_does() {
    let server = tx_server(ResponseTemplate::new(504)).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let err = tx
        .execute("DELETE FROM t RETURNING id")
        .fetch::<i64>()
        .await
        .unwrap_err();
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert_eq!(
        bodies(&server, STATEMENT).await.len(),
        3,
        "retried as a step"
    );
    assert_eq!(
        bodies(&server, ROLLBACK).await.len(),
        1,
        "rolled back at once"
    );
    let err = tx.query("SELECT 1").fetch_one::<i64>().await.unwrap_err();
    assert!(err.is_transaction_lost() && !err.is_sent(), "{err:?}");
    let err = tx.commit().await.unwrap_err();
    assert!(err.is_transaction_lost(), "{err:?}");
    assert_eq!(bodies(&server, COMMIT).await.len(), 0);
}

/// A cut stream's first re-read is cut too, before it has skipped the rows already given; the
/// second re-read completes: the rows given stay given once (the rows to skip never shrink to
/// what a cut re-read got through), every row once, in order.
#[tokio::test]
async fn a_re_read_cut_while_it_skips_given_rows_gives_no_row_twice() {
    let result = rows_result(2_000);
    // About 1,000 rows given, then a re-read cut after about 500 (all of them to skip).
    let (url, received) =
        cutting_server(result.clone(), &[result.len() / 2, result.len() / 4]).await;
    let client = Client::builder(url)
        .http_client(plain_http())
        .retry(sqlhttp::RetryPolicy::new().with_jitter_seed(7))
        .build()
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let mut rows = tx.query("SELECT n FROM t").fetch::<i64>();
    let mut got = Vec::new();
    while let Some(n) = rows.try_next().await.unwrap() {
        got.push(n);
    }
    assert_eq!(got.len(), 2_000, "no row given twice or left out");
    assert_eq!(
        got,
        (1..=2_000).collect::<Vec<_>>(),
        "every row once, in order"
    );
    drop(rows);
    tx.commit().await.unwrap();
    let sent = received.lock().unwrap().clone();
    assert_eq!(sent.len(), 3, "read again twice: {sent:?}");
    assert!(sent.iter().all(|s| s["seq"] == 1), "{sent:?}");
}

/// Waits (real time) until `server` has received `n` requests on `route`.
async fn until_received(server: &MockServer, route: &str, n: usize) {
    for _ in 0..500 {
        if bodies(server, route).await.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{route} received fewer than {n} requests");
}

/// The rest of a transaction whose statement's call was dropped after it was sent: the
/// statement ran on the server or not, so the transaction is lost, rolled back, never committed.
async fn assert_lost_after_a_dropped_step(server: &MockServer, tx: sqlhttp::Transaction) {
    until_received(server, STATEMENT, 1).await;
    let err = tx.execute("UPDATE t SET n = 2").await.unwrap_err();
    assert!(err.is_transaction_lost() && !err.is_sent(), "{err:?}");
    assert!(err.to_string().contains("dropped"), "{err}");
    let err = tx.commit().await.unwrap_err();
    assert!(err.is_transaction_lost(), "{err:?}");
    assert_eq!(
        bodies(server, STATEMENT).await.len(),
        1,
        "nothing sent after"
    );
    assert_eq!(bodies(server, COMMIT).await.len(), 0, "never committed");
    assert_eq!(
        bodies(server, ROLLBACK).await,
        [json!({"transaction": "tx1"})],
        "rolled back once"
    );
}

/// A step's future dropped once its request went out (a `timeout` around it): the server ran
/// (or will run) statement 1, so the transaction cannot go on as if it had not.
#[tokio::test]
async fn a_step_dropped_after_it_was_sent_loses_the_transaction() {
    let server = tx_server(ok_effect(1, None).set_delay(Duration::from_secs(3))).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let timed_out =
        tokio::time::timeout(Duration::from_millis(500), tx.execute("UPDATE t SET n = 1")).await;
    assert!(timed_out.is_err(), "the answer is slower than the timeout");
    assert_lost_after_a_dropped_step(&server, tx).await;
}

/// The same for a stream dropped before its first row.
#[tokio::test]
async fn a_stream_dropped_before_its_first_row_loses_the_transaction() {
    let server = tx_server(ok_rows(&["n"], &json!([[1]])).set_delay(Duration::from_secs(3))).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let mut rows = tx.execute("DELETE FROM t RETURNING n").fetch::<i64>();
    let timed_out = tokio::time::timeout(Duration::from_millis(500), rows.try_next()).await;
    assert!(timed_out.is_err(), "the answer is slower than the timeout");
    drop(rows);
    assert_lost_after_a_dropped_step(&server, tx).await;
}

/// A step dropped while it waits for the one before it (nothing of it sent) costs nothing: the
/// transaction goes on and commits what ran.
#[tokio::test]
async fn a_step_dropped_before_it_was_sent_leaves_the_transaction_going_on() {
    let server = tx_server(ok_effect(1, None).set_delay(Duration::from_millis(800))).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let first = tokio::spawn(tx.execute("UPDATE t SET n = 1").into_future());
    until_received(&server, STATEMENT, 1).await;
    let waiting =
        tokio::time::timeout(Duration::from_millis(50), tx.execute("UPDATE t SET n = 2")).await;
    assert!(waiting.is_err(), "it waits for the statement before it");
    first.await.unwrap().unwrap();
    tx.execute("UPDATE t SET n = 3").await.unwrap();
    tx.commit().await.unwrap();
    let seqs: Vec<Value> = bodies(&server, STATEMENT)
        .await
        .iter()
        .map(|b| b["seq"].clone())
        .collect();
    assert_eq!(seqs, [json!(1), json!(2)], "the dropped one never sent");
    assert_eq!(bodies(&server, COMMIT).await.len(), 1);
    assert_eq!(bodies(&server, ROLLBACK).await.len(), 0);
}

/// A row the caller's type cannot take, in an answer the server gave: the statement ran and is
/// in the transaction; the caller gets the decode error and the transaction goes on.
#[tokio::test(start_paused = true)]
async fn a_step_s_rows_that_do_not_decode_leave_the_transaction_going_on() {
    let server = tx_server(ok_rows(&["n"], &json!([["not a number"]]))).await;
    let client = builder(&server).build().unwrap();
    let tx = client.transaction().await.unwrap();
    let err = tx
        .execute("UPDATE t SET n = 'not a number' RETURNING n")
        .fetch_one::<i64>()
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Decode { row: Some(0), .. }),
        "{err:?}"
    );
    assert!(!err.is_outcome_unknown(), "{err:?}");
    assert_eq!(bodies(&server, ROLLBACK).await.len(), 0, "not rolled back");
    tx.execute("UPDATE t SET m = 1").await.unwrap();
    tx.commit().await.unwrap();
    let seqs: Vec<Value> = bodies(&server, STATEMENT)
        .await
        .iter()
        .map(|b| b["seq"].clone())
        .collect();
    assert_eq!(
        seqs,
        [json!(1), json!(2)],
        "the next statement takes the next number"
    );
    assert_eq!(bodies(&server, COMMIT).await.len(), 1);
}
