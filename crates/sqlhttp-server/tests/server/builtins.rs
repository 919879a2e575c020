//! Built-in functions whose one call used to outlast every bound (issue 18, finding 2): one call
//! is one step of SQLite's virtual machine, and the progress handler only runs between steps.
//! `instr(zeroblob(2*?), zeroblob(?)||x'01')` with 1 MB ran 25 s under a 1 s timeout, went on
//! after its client left and held up shutdown as long. Through the HTTP API: each such call now
//! answers at once or stops within the timeout, for a client that leaves, and at shutdown.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{Config, Limits, Server};

use crate::common::{Reply, app_with, http_client, sql};

const TIMEOUT: Duration = Duration::from_secs(1);

/// How long an answer may take: the timeout and a wide margin (a bound, not a benchmark).
const BOUND: Duration = Duration::from_secs(3);

const MB: i64 = 1 << 20;

/// The finding's calls, each quadratic in SQLite's own implementation (minutes to hours at this
/// size), with what they answer. A `trim` set stays under the value limit's table of a pointer
/// and a length per character (SQLite refuses a larger set as too big).
fn quadratic_calls() -> Vec<(&'static str, Value)> {
    vec![
        ("instr(zeroblob(2*?1), zeroblob(?1)||x'01')", json!(0)),
        (
            "length(replace(printf('%.*c', 2*?1, 'a'), printf('%.*c', ?1, 'a')||'b', 'x'))",
            json!(2 * MB),
        ),
        (
            "length(trim(printf('%.*c', ?1, 'a'), printf('%.*c', ?1 / 4, 'b')||'a'))",
            json!(0),
        ),
        (
            "length(ltrim(printf('%.*c', ?1, 'a'), printf('%.*c', ?1 / 4, 'b')||'a'))",
            json!(0),
        ),
        (
            "length(rtrim(printf('%.*c', ?1, 'a'), printf('%.*c', ?1 / 4, 'b')||'a'))",
            json!(0),
        ),
        (
            "length(unhex(printf('%.*c', ?1, ' '), printf('%.*c', ?1, 'x')||' '))",
            json!(0),
        ),
    ]
}

/// A LIKE that takes N×M comparisons however it is implemented (3 MiB × 5000), and the GLOB
/// of the same shape: minutes in one call.
const SLOW_LIKE: &str =
    "SELECT printf('%.*c', 3145728, 'a') LIKE '%'||printf('%.*c', 5000, 'a')||'b'";
const SLOW_GLOB: &str =
    "SELECT printf('%.*c', 3145728, 'a') GLOB '*'||printf('%.*c', 5000, 'a')||'b'";

/// `call` (over `?1`) on every row of an endless query: each row's call was one long step.
fn on_every_row(call: &str) -> String {
    let call = call.replace("?1", "(?1 + x % 2)");
    format!(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
         SELECT count(*) FROM c WHERE {call} IS NOT NULL"
    )
}

fn limits(statement_timeout: Duration) -> Limits {
    Limits {
        statement_timeout,
        read_connections: 1,
        ..Limits::default()
    }
}

/// The reply to `text` on a fresh server (so one call that never ends cannot hold up the next
/// case), or why it failed: no answer within [`BOUND`] (rather than wait the minutes or hours
/// such a call took).
async fn answer(text: &str, params: Value) -> Result<Reply, String> {
    let app = app_with(Config {
        limits: limits(TIMEOUT),
        ..Config::default()
    });
    tokio::time::timeout(BOUND, sql(&app, text, params))
        .await
        .map_err(|_| format!("no answer within {BOUND:?}: {text}"))
}

#[tokio::test]
async fn calls_that_were_quadratic_answer_at_once() {
    let mut failures = Vec::new();
    for (call, expected) in quadratic_calls() {
        let text = format!("SELECT {call}");
        match answer(&text, json!([MB])).await {
            Ok(reply) if reply.status == 200 && reply.json()["rows"] == json!([[expected]]) => {}
            Ok(reply) => failures.push(format!(
                "{text}: {} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            )),
            Err(failure) => failures.push(failure),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test]
async fn a_long_builtin_call_ends_at_the_statement_timeout() {
    let mut statements: Vec<(String, Value)> = vec![
        (SLOW_LIKE.to_owned(), json!([])),
        (SLOW_GLOB.to_owned(), json!([])),
    ];
    // A quarter of the size on every row: still seconds to hours per call in SQLite's own.
    for (call, _) in quadratic_calls() {
        statements.push((on_every_row(call), json!([MB / 4])));
    }
    let mut failures = Vec::new();
    for (text, params) in statements {
        match answer(&text, params).await {
            Ok(reply) if reply.status == 422 && reply.code() == "STATEMENT_TIMEOUT" => {}
            Ok(reply) => failures.push(format!(
                "{text}: {} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            )),
            Err(failure) => failures.push(failure),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test]
async fn a_client_that_leaves_frees_the_reader_its_call_held() {
    // The only reader, and a timeout that would not end the call in the test's lifetime.
    let app = app_with(Config {
        limits: limits(Duration::from_secs(600)),
        ..Config::default()
    });
    for (statement, params) in [
        (SLOW_LIKE.to_owned(), json!([])),
        (on_every_row(quadratic_calls()[0].0), json!([MB / 4])),
    ] {
        let abandoned =
            tokio::time::timeout(Duration::from_millis(300), sql(&app, &statement, params)).await;
        assert!(
            abandoned.is_err(),
            "{statement} answered before it was left"
        );
        let next = tokio::time::timeout(BOUND, sql(&app, "SELECT 1", json!([])))
            .await
            .unwrap_or_else(|_| panic!("the reader was still busy with {statement}"));
        assert_eq!(next.status, 200);
    }
}

#[tokio::test]
async fn shutdown_is_not_held_up_by_a_long_call() {
    let handle = Server::bind(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        limits: limits(Duration::from_secs(600)),
        ..Config::default()
    })
    .await
    .unwrap()
    .spawn();
    let url = format!("{}/api/v1/sql", handle.url());
    let mut requests = Vec::new();
    for (statement, params) in [
        (SLOW_LIKE.to_owned(), json!([])),
        (on_every_row(quadratic_calls()[0].0), json!([MB / 4])),
    ] {
        let request = http_client()
            .post(&url)
            .header("content-type", "application/json")
            .body(json!({ "sql": statement, "params": params }).to_string());
        requests.push(tokio::spawn(request.send()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), handle.shutdown())
        .await
        .expect("shutdown waited for the running calls");
    // The grace period for open connections (2 s), then the engine closes at once.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "shutdown took {took:?}");
    for request in requests {
        request.abort();
    }
}

/// SQLite's LIKE/GLOB matcher recurses once per wildcard; the replacement must answer a pattern
/// of as many wildcards as the pattern limit allows (a first port overflowed its stack).
#[tokio::test]
async fn a_pattern_of_many_wildcards_answers() {
    let app = app_with(Config::default());
    for (operator, wildcard) in [("LIKE", "%a"), ("GLOB", "*a")] {
        let text = format!(
            "SELECT printf('%.*c', 60000, 'a') {operator} \
             replace(printf('%.*c', 24999, 'x'), 'x', '{wildcard}') || 'b'"
        );
        let reply = tokio::time::timeout(BOUND, sql(&app, &text, json!([])))
            .await
            .unwrap_or_else(|_| panic!("no answer within {BOUND:?}: {text}"));
        assert_eq!(
            reply.status,
            200,
            "{operator}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.json()["rows"], json!([[0]]), "{operator}");
    }
}
