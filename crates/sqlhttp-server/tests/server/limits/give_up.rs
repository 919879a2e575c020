//! Statements SQLite cannot stop in time (issue 18, ADR 0032): its progress handler runs only
//! when the virtual machine jumps, so straight-line work (a row of many JSON calls, nested calls,
//! a long FTS phrase) ran 5-26 s under a 1 s timeout. The engine now gives such a connection up a
//! second after the statement had to stop: its client is answered, the pool gets a fresh
//! connection, a given-up write never commits, shutdown does not wait, and the given-up threads
//! are capped. Through the HTTP API, in-process and (for the thread count) the binary.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlhttp_server::{Config, Limits, Server};

use crate::common::{Reply, app_with, http_client, post_json, post_with, send, sql, start};

/// Statement timeout of every server here.
const TIMEOUT: Duration = Duration::from_secs(1);

/// How long a stuck statement's answer may take: the timeout, the one-second margin before a
/// connection is given up, and room for a busy machine. The old engine took 5-8 s on these.
const BOUND: Duration = Duration::from_millis(3500);

/// A 4 MB JSON text array of two million zeros, built over many steps (each step checks the
/// clock); the calls on it below are one stretch of straight-line work.
const ARRAY: &str = "WITH v(a) AS MATERIALIZED \
    (SELECT '[' || replace(printf('%.*c', 1999999, 'x'), 'x', '0,') || '0]')";

/// One row of 300 `json_extract(a, '$[#-1]')` columns: each call walks the whole array, and no
/// jump comes between them (about 5.5 s in a debug build).
fn many_columns() -> String {
    let columns = vec!["json_extract(a, '$[#-1]')"; 300].join(", ");
    format!("{ARRAY} SELECT {columns} FROM v")
}

/// Six nested `json_set` calls of 60 paths each, every path an edit that counts and moves the
/// whole array (about 5 s). Each level keeps its own copy until the call above it returns, so
/// nesting one path a call (ADR 0026's shape) runs into `--max-engine-memory` before it runs
/// long at this size.
fn nested(over: &str) -> String {
    let paths = vec!["'$[#]', 1"; 60].join(", ");
    let mut call = over.to_owned();
    for _ in 0..6 {
        call = format!("json_set({call}, {paths})");
    }
    format!("length({call})")
}

fn nested_json_set() -> String {
    format!("{ARRAY} SELECT {} FROM v", nested("a"))
}

/// An FTS4 row of 400 000 tokens and a phrase of 1 000 that matches nowhere: one step of the
/// virtual table costs row × phrase (about 6 s).
const FTS_SETUP: [&str; 2] = [
    "CREATE VIRTUAL TABLE f4 USING fts4(body)",
    "INSERT INTO f4 VALUES (replace(printf('%.*c', 400000, 'x'), 'x', 'a '))",
];

fn fts_phrase() -> (&'static str, Value) {
    let phrase = format!("\"{} b\"", vec!["a"; 1000].join(" "));
    ("SELECT count(*) FROM f4 WHERE f4 MATCH ?1", json!([phrase]))
}

fn limits(read_connections: usize, statement_timeout: Duration) -> Limits {
    Limits {
        statement_timeout,
        read_connections,
        ..Limits::default()
    }
}

fn app(read_connections: usize) -> axum::Router {
    app_with(&Config {
        limits: limits(read_connections, TIMEOUT),
        ..Config::default()
    })
}

/// The start of a reply's body, for messages.
fn body(reply: &Reply) -> String {
    String::from_utf8_lossy(&reply.body)
        .chars()
        .take(300)
        .collect()
}

fn is_timeout(reply: &Reply) -> bool {
    reply.status == 422 && reply.code() == "STATEMENT_TIMEOUT"
}

async fn ok(app: &axum::Router, text: &str) {
    let reply = sql(app, text, json!([])).await;
    assert_eq!(reply.status, 200, "{text}: {}", body(&reply));
}

/// A set-up statement that is heavy for the tests' 1 s timeout: on a loaded machine it may time
/// out (and is then rolled back whole), so it is sent again, a few times, before that counts.
async fn set_up(app: &axum::Router, text: &str) {
    for _ in 0..4 {
        let reply = sql(app, text, json!([])).await;
        if !is_timeout(&reply) {
            assert_eq!(reply.status, 200, "{text}: {}", body(&reply));
            return;
        }
    }
    ok(app, text).await;
}

/// A number from `GET /metrics`.
async fn metric(app: &axum::Router, name: &str) -> u64 {
    let reply = send(app, "GET", "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&reply.body);
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Waits until no given-up statement runs any more (what the old engine made the client wait
/// for), within a bounded while.
async fn strays_end(app: &axum::Router) {
    let until = Instant::now() + Duration::from_secs(60);
    while metric(app, "sqlhttpd_engine_given_up_running").await > 0 {
        assert!(Instant::now() < until, "a given-up statement never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn straight_line_json_statements_answer_near_the_timeout() {
    let _timed = crate::common::MACHINE.read().await;
    let cases = [
        ("300 json_extract columns", app(1), many_columns()),
        ("6 nested json_set of 60 paths", app(1), nested_json_set()),
    ];
    let mut failures = Vec::new();
    for (name, app, text) in &cases {
        let sent = Instant::now();
        let reply = sql(app, text, json!([])).await;
        let took = sent.elapsed();
        if !is_timeout(&reply) || took >= BOUND {
            failures.push(format!(
                "{name}: {} after {took:?}: {}",
                reply.status,
                body(&reply)
            ));
        }
        if metric(app, "sqlhttpd_engine_given_up_total").await != 1 {
            failures.push(format!("{name}: its connection was not given up"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// In the binary: the phrase holds a copy of the row's position list per token (about 400 MB),
/// which beside the other tests' statements would pass the process's engine memory limit.
#[tokio::test]
async fn a_long_fts_phrase_answers_near_the_timeout() {
    let _timed = crate::common::MACHINE.read().await;
    let (mut child, url) = start(&[
        "--listen",
        "127.0.0.1:0",
        "--statement-timeout",
        "1s",
        "--read-connections",
        "1",
    ]);
    for setup in FTS_SETUP {
        let (status, answer) = post_json(&url, "/api/v1/sql", &json!({ "sql": setup })).await;
        assert_eq!(status, 200, "{setup}: {answer}");
    }
    let (phrase, params) = fts_phrase();
    let sent = Instant::now();
    let (status, answer) = post_json(
        &url,
        "/api/v1/sql",
        &json!({ "sql": phrase, "params": params }),
    )
    .await;
    let took = sent.elapsed();
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "STATEMENT_TIMEOUT", "{answer}");
    assert!(took < BOUND, "the phrase query answered after {took:?}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn reads_are_served_while_every_reader_is_stuck() {
    let _timed = crate::common::MACHINE.read().await;
    let app = app(2);
    let stuck = many_columns();
    let quick = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        let reply = sql(&app, "SELECT 1", json!([])).await;
        let running = metric(&app, "sqlhttpd_engine_given_up_running").await;
        (reply, sent.elapsed(), running)
    };
    let (first, second, (reply, took, running)) = tokio::join!(
        sql(&app, &stuck, json!([])),
        sql(&app, &stuck, json!([])),
        quick
    );
    assert!(is_timeout(&first) && is_timeout(&second));
    assert_eq!(reply.status, 200, "{}", body(&reply));
    assert!(took < BOUND, "the point read waited {took:?}");
    assert!(
        running > 0,
        "the stuck statements had ended: nothing was shown"
    );
}

#[tokio::test]
async fn a_client_that_leaves_frees_its_reader_within_two_seconds() {
    let _timed = crate::common::MACHINE.read().await;
    // The only reader, and a timeout that would not end the statement.
    let app = app_with(&Config {
        limits: limits(1, Duration::from_secs(60)),
        ..Config::default()
    });
    let left = tokio::time::timeout(
        Duration::from_millis(300),
        sql(&app, &many_columns(), json!([])),
    )
    .await;
    assert!(
        left.is_err(),
        "the statement answered before its client left"
    );
    let sent = Instant::now();
    let reply = sql(&app, "SELECT 1", json!([])).await;
    let took = sent.elapsed();
    assert_eq!(reply.status, 200, "{}", body(&reply));
    assert!(
        took < Duration::from_millis(2500),
        "the reader stayed held {took:?}"
    );
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_stuck_statement() {
    let _timed = crate::common::MACHINE.read().await;
    for (timeout, bound) in [
        // Given up a second after its timeout, while the open connection's grace runs.
        (TIMEOUT, Duration::from_millis(2500)),
        // No deadline soon: the grace for open connections (2 s), then a second after the
        // engine began to close.
        (Duration::from_secs(60), Duration::from_secs(4)),
    ] {
        let handle = Server::bind(Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            limits: limits(1, timeout),
            ..Config::default()
        })
        .await
        .unwrap()
        .spawn();
        let request = http_client()
            .post(format!("{}/api/v1/sql", handle.url()))
            .header("content-type", "application/json")
            .body(json!({ "sql": many_columns() }).to_string());
        let request = tokio::spawn(request.send());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), handle.shutdown())
            .await
            .expect("shutdown waited for the stuck statement");
        let took = started.elapsed();
        assert!(took < bound, "shutdown took {took:?} (timeout {timeout:?})");
        request.abort();
    }
}

#[tokio::test]
async fn a_given_up_write_is_never_committed() {
    let _timed = crate::common::MACHINE.read().await;
    let app = app(1);
    ok(&app, "CREATE TABLE t (x)").await;
    let write = format!("{ARRAY} INSERT INTO t (x) SELECT {} FROM v", nested("a"));
    let sent = Instant::now();
    let reply = sql(&app, &write, json!([])).await;
    let took = sent.elapsed();
    assert!(is_timeout(&reply), "{}", body(&reply));
    assert!(took < BOUND, "the write answered after {took:?}");
    // Its statement ends on its own, after its answer: it still must not have written.
    strays_end(&app).await;
    let count = sql(&app, "SELECT count(*) FROM t", json!([])).await;
    assert_eq!(
        count.json()["rows"],
        json!([[0]]),
        "the given-up write committed"
    );
    ok(&app, "INSERT INTO t VALUES (1)").await;
}

#[tokio::test]
async fn a_given_up_keyed_write_applies_once_when_retried() {
    let _timed = crate::common::MACHINE.read().await;
    let app = app(1);
    ok(&app, "CREATE TABLE t (x)").await;
    ok(&app, "CREATE TABLE big (a)").await;
    set_up(
        &app,
        "INSERT INTO big SELECT '[' || replace(printf('%.*c', 1999999, 'x'), 'x', '0,') || '0]'",
    )
    .await;
    let keyed = json!({
        "sql": format!("INSERT INTO t (x) SELECT {} FROM big", nested("a")),
        "params": [],
    });
    let key = [("idempotency-key", "given-up-once")];
    let sent = Instant::now();
    let reply = post_with(&app, &key, &keyed).await;
    let took = sent.elapsed();
    assert!(is_timeout(&reply), "{}", body(&reply));
    assert!(took < BOUND, "the keyed write answered after {took:?}");
    strays_end(&app).await;
    // The data no longer makes the statement slow; the same request, retried, runs once.
    ok(&app, "UPDATE big SET a = '[0]'").await;
    let retried = post_with(&app, &key, &keyed).await;
    assert_eq!(retried.status, 200, "{}", body(&retried));
    assert_eq!(retried.json()["rows_affected"], json!(1));
    assert_eq!(retried.header("idempotent-replayed"), None);
    let replayed = post_with(&app, &key, &keyed).await;
    assert_eq!(replayed.status, 200, "{}", body(&replayed));
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    let count = sql(&app, "SELECT count(*) FROM t", json!([])).await;
    assert_eq!(count.json()["rows"], json!([[1]]), "applied once");
}

/// The server's thread count, from /proc (Linux).
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn more_stuck_statements_than_the_stray_cap_keep_the_server_bounded() {
    let _timed = crate::common::MACHINE.read().await;
    // One reader: one stray is replaced, the next leaves the pool without a connection.
    let (mut child, url) = start(&[
        "--listen",
        "127.0.0.1:0",
        "--statement-timeout",
        "1s",
        "--read-connections",
        "1",
    ]);
    let pid = child.id();
    let client = http_client();
    let post = |text: String| {
        client
            .post(format!("{url}/api/v1/sql"))
            .header("content-type", "application/json")
            .body(json!({ "sql": text }).to_string())
            .send()
    };
    assert_eq!(post("SELECT 1".to_owned()).await.unwrap().status(), 200);
    let baseline = threads(pid);
    let stuck: Vec<_> = (0..5).map(|_| tokio::spawn(post(many_columns()))).collect();
    let mut most = baseline;
    let mut statuses = Vec::new();
    let until = Instant::now() + Duration::from_secs(15);
    for request in stuck {
        while !request.is_finished() {
            assert!(Instant::now() < until, "a stuck request was never answered");
            most = most.max(threads(pid));
            let health = client.get(format!("{url}/healthz")).send().await.unwrap();
            assert_eq!(health.status(), 200);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        statuses.push(request.await.unwrap().unwrap().status().as_u16());
    }
    // Given up (the first replaced, the next past the cap while the first still runs), or
    // refused at once while no reader is left: which depends on when the strays end.
    assert!(
        statuses.iter().all(|status| [422, 503].contains(status)),
        "{statuses:?}"
    );
    assert!(
        most <= baseline + 2,
        "{most} threads at most, {baseline} before"
    );
    // Once a stray ends, a fresh reader serves again (a stray's few seconds of work can take
    // far longer on a machine the other tests keep busy).
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let reply = post("SELECT 1".to_owned()).await.unwrap();
        if reply.status() == 200 {
            break;
        }
        assert!(Instant::now() < until, "the readers never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// FTS5's hidden `rank` column can be set to call an auxiliary function (`snippet()`,
/// `highlight()`: quadratic, inside one step of the table) by a query's constraint or by the
/// table's stored setting; the sandbox's refusal of those names by call does not see either.
/// Both are refused, by what the statement does; ranking by `bm25()` stays.
#[tokio::test]
async fn fts5_rank_cannot_be_set_to_a_function() {
    let _timed = crate::common::MACHINE.read().await;
    // No readers: every statement runs on the writer, whose FTS5 table object saw the refused
    // setting in memory before it was undone.
    let app = app_with(&Config {
        limits: limits(0, TIMEOUT),
        ..Config::default()
    });
    for setup in [
        "CREATE VIRTUAL TABLE f5 USING fts5(body)",
        "INSERT INTO f5 VALUES ('a b a'), ('b a c')",
        "CREATE TABLE scores (rank INTEGER)",
        "INSERT INTO scores VALUES (1)",
    ] {
        ok(&app, setup).await;
    }
    // A rank function's arguments follow the table's own, which FTS5 passes.
    let snippet = "snippet(0, '[', ']', '...', 8)";
    let refused: Vec<(String, Value)> = vec![
        (
            format!(
                "SELECT body FROM f5 WHERE f5 MATCH 'a' AND rank MATCH '{}'",
                snippet.replace('\'', "''")
            ),
            json!([]),
        ),
        (
            "SELECT body FROM f5 WHERE f5 MATCH 'a' AND rank = ?1".to_owned(),
            json!([snippet]),
        ),
        // PostgreSQL's reading ends the comment at `\r` and sees EXPLAIN; SQLite's runs to
        // `\n` and runs the SELECT: whether a statement is an EXPLAIN is SQLite's to say.
        (
            "--\rEXPLAIN\nSELECT body FROM f5 WHERE f5 MATCH 'a' AND rank = ?1".to_owned(),
            json!([snippet]),
        ),
        (
            "SELECT body FROM f5 WHERE ?1 = f5.\"RANK\" AND f5 MATCH 'a'".to_owned(),
            json!(["highlight(0, '[', ']')"]),
        ),
        (
            "SELECT count(*) FROM (SELECT body FROM f5 WHERE match(?1, rank) AND f5 MATCH 'a')"
                .to_owned(),
            json!([snippet]),
        ),
        (
            "INSERT INTO f5 (f5, rank) VALUES ('rank', ?1)".to_owned(),
            json!([snippet]),
        ),
        (
            "INSERT INTO f5 (f5, rank) SELECT ?1, ?2".to_owned(),
            json!(["RANK", "bm25(10.0)"]),
        ),
    ];
    for (text, params) in &refused {
        let reply = sql(&app, text, params.clone()).await;
        assert_eq!(reply.status, 403, "{text}: {}", body(&reply));
        assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{text}");
        let message = reply.json()["error"]["message"].to_string();
        assert!(message.contains("bm25(table"), "{text}: {message}");
    }
    // The same command, keyed: refused, and nothing stored.
    let keyed = post_with(
        &app,
        &[("idempotency-key", "rank-config")],
        &json!({ "sql": "INSERT INTO f5 (f5, rank) VALUES ('rank', ?1)", "params": [snippet] }),
    )
    .await;
    assert_eq!(keyed.status, 403, "{}", body(&keyed));
    let stored = sql(
        &app,
        "SELECT count(*) FROM f5_config WHERE k = 'rank' COLLATE NOCASE",
        json!([]),
    )
    .await;
    assert_eq!(stored.json()["rows"], json!([[0]]), "{}", body(&stored));
    // What the refusal points to works, and rank is still bm25's number on this connection.
    for (text, rows) in [
        (
            "SELECT typeof(rank) FROM f5 WHERE f5 MATCH 'a' ORDER BY rank LIMIT 1",
            json!([["real"]]),
        ),
        (
            "SELECT count(*) FROM f5 WHERE f5 MATCH 'a' ORDER BY bm25(f5, 10.0)",
            json!([[2]]),
        ),
        ("SELECT rank FROM scores WHERE rank = 1", json!([[1]])),
    ] {
        let reply = sql(&app, text, json!([])).await;
        assert_eq!(reply.status, 200, "{text}: {}", body(&reply));
        assert_eq!(reply.json()["rows"], rows, "{text}");
    }
    // Commands that do not set rank still run.
    for command in [
        "INSERT INTO f5 (f5) VALUES ('optimize')",
        "INSERT INTO f5 (f5, rank) VALUES ('merge', 16)",
        "INSERT INTO f5 (f5, rank) VALUES ('automerge', 4)",
        "INSERT INTO f5 (f5, rank) VALUES ('integrity-check', 0)",
    ] {
        ok(&app, command).await;
    }
}
