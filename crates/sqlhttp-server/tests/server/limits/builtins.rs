//! Built-in functions whose one call used to outlast every bound (issue 18, finding 2): one call
//! is one step of SQLite's virtual machine, and the progress handler only runs between steps.
//! `instr(zeroblob(2*?), zeroblob(?)||x'01')` with 1 MB ran 25 s under a 1 s timeout, went on
//! after its client left and held up shutdown as long. Through the HTTP API: each such call now
//! answers at once or stops within the timeout, for a client that leaves, and at shutdown; so does
//! `json_patch` of many keys, and FTS `snippet()`/`highlight()` are refused (ADR 0026).

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
    let app = app_with(&Config {
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
    let app = app_with(&Config {
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
    let app = app_with(&Config::default());
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

/// `json_patch(T, P)` of two objects of this many distinct keys: SQLite's merge scans the
/// target for every key of the patch (20 000 keys: 6 s, 40 000: 44 s in one step in a release
/// build; ADR 0026).
const PATCH_KEYS: usize = 60_000;

/// An object of [`PATCH_KEYS`] keys named `prefix` and a number.
fn many_keys(prefix: &str) -> String {
    let members: Vec<String> = (0..PATCH_KEYS)
        .map(|i| format!(r#""{prefix}{i}":{i}"#))
        .collect();
    format!("{{{}}}", members.join(","))
}

#[tokio::test]
async fn json_patch_of_many_keys_answers_at_once() {
    let (target, patch) = (many_keys("t"), many_keys("p"));
    // The patch's members follow the target's: `{t...,p...}`.
    let merged = target.len() + patch.len() - 1;
    for call in ["json_patch(?1, ?2)", "json(jsonb_patch(?1, ?2))"] {
        let text = format!("SELECT length({call})");
        let reply = answer(&text, json!([target, patch])).await.unwrap();
        // At once, or (a debug build on a busy machine) stopped at the timeout.
        let stopped = reply.status == 422 && reply.code() == "STATEMENT_TIMEOUT";
        assert!(
            stopped || (reply.status == 200 && reply.json()["rows"] == json!([[merged]])),
            "{call}: {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
    }
}

#[tokio::test]
async fn json_patch_keeps_sqlite_results() {
    let app = app_with(&Config::default());
    for (call, expected) in [
        (
            r#"json_patch('{"a":1,"b":{"c":2}}', '{"b":{"c":null,"d":[1]},"e":"x","a":null}')"#,
            json!(r#"{"b":{"d":[1]},"e":"x"}"#),
        ),
        // The result is JSON, not a string, for the functions that embed it.
        (
            r#"json_object('k', json_patch('{}', '{"a":1.50}'))"#,
            json!(r#"{"k":{"a":1.50}}"#),
        ),
        // JSON5 is taken, as SQLite takes it.
        (
            r#"json_patch('{a:1}', '{b:0x10,}')"#,
            json!(r#"{"a":1,"b":16}"#),
        ),
    ] {
        let reply = sql(&app, &format!("SELECT {call}"), json!([])).await;
        assert_eq!(reply.json()["rows"], json!([[expected]]), "{call}");
    }
    let reply = sql(&app, "SELECT json_patch('{', '{}')", json!([])).await;
    assert_eq!(reply.status, 400);
    assert!(
        String::from_utf8_lossy(&reply.body).contains("malformed JSON"),
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
}

#[tokio::test]
async fn fts_snippet_and_highlight_are_refused_with_the_reason() {
    let app = app_with(&Config::default());
    for setup in [
        "CREATE VIRTUAL TABLE f5 USING fts5(body)",
        "CREATE VIRTUAL TABLE f4 USING fts4(body)",
        "INSERT INTO f5 VALUES ('a b a')",
        "INSERT INTO f4 VALUES ('a b a')",
    ] {
        let reply = sql(&app, setup, json!([])).await;
        assert_eq!(
            reply.status,
            200,
            "{setup}: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    for call in [
        "SELECT snippet(f5, 0, '[', ']', '...', 8) FROM f5 WHERE f5 MATCH 'a'",
        "SELECT highlight(f5, 0, '[', ']') FROM f5 WHERE f5 MATCH 'a'",
        "SELECT SNIPPET(f4) FROM f4 WHERE f4 MATCH 'a'",
    ] {
        let reply = sql(&app, call, json!([])).await;
        assert_eq!(reply.status, 403, "{call}");
        assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{call}");
        let message = reply.json()["error"]["message"].to_string();
        assert!(message.contains("quadratic"), "{call}: {message}");
    }
    // What the refusal points to still works.
    let reply = sql(
        &app,
        "SELECT body, bm25(f5) FROM f5 WHERE f5 MATCH 'a' ORDER BY rank",
        json!([]),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let reply = sql(
        &app,
        "SELECT offsets(f4) FROM f4 WHERE f4 MATCH 'a'",
        json!([]),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
}

#[tokio::test]
async fn a_call_with_too_many_arguments_is_a_clear_400() {
    let app = app_with(&Config::default());
    let paths = vec!["'$'"; 1000].join(", ");
    let reply = sql(
        &app,
        &format!("SELECT json_extract('[]', {paths})"),
        json!([]),
    )
    .await;
    assert_eq!(
        reply.status,
        400,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.code(), "SQL_ERROR");
    let message = reply.json()["error"]["message"].to_string();
    assert!(message.contains("too many arguments"), "{message}");
}
