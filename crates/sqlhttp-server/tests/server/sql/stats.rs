//! What a success cost, as the protocol says it on both engines (issue 40): every success body
//! of a statement (whole or streamed), of each batch result and the whole batch, of a
//! transaction's statement and its commit ends with `stats`; every success of `/api/` carries
//! `Server-Timing` (`queue`, `db`, `total`), read back here with a parser of the browser's
//! format; every answer names its engine in `Sqlhttp-Engine`; a replayed keyed write answers its
//! first execution's stats with a `Server-Timing` of its own.
//!
//! Knows the public HTTP API and the protocol crate's `Stats`; nothing about the engines.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sqlhttp_protocol::body::{QueryResult, ServedBy, Stats};

use crate::common::{Reply, send};
use crate::engines::{Engine, engine_app, on_both_engines};

/// One metric of a `Server-Timing` header: its `dur` and `desc`, when given.
#[derive(Debug, Default, PartialEq)]
struct Metric {
    dur: Option<f64>,
    desc: Option<String>,
}

/// Parses `Server-Timing` as a browser does (W3C Server Timing, section 3): comma-separated
/// metrics, each a token name then `;param=value` pairs, a value a token or a quoted string;
/// the first of a repeated parameter counts, unknown parameters are ignored.
fn server_timing(header: &str) -> BTreeMap<String, Metric> {
    let mut metrics = BTreeMap::new();
    let mut rest = header;
    loop {
        rest = rest.trim_start();
        let name_end = rest.find([';', ',']).unwrap_or(rest.len());
        let name = rest[..name_end].trim().to_owned();
        rest = &rest[name_end..];
        let mut metric = Metric::default();
        while let Some(after) = rest.strip_prefix(';') {
            let key_end = after.find(['=', ';', ',']).unwrap_or(after.len());
            let key = after[..key_end].trim().to_ascii_lowercase();
            rest = &after[key_end..];
            let mut value = String::new();
            if let Some(after) = rest.strip_prefix('=') {
                let after = after.trim_start();
                if let Some(quoted) = after.strip_prefix('"') {
                    let mut chars = quoted.char_indices();
                    let mut end = quoted.len();
                    while let Some((at, c)) = chars.next() {
                        match c {
                            '\\' => {
                                if let Some((_, escaped)) = chars.next() {
                                    value.push(escaped);
                                }
                            }
                            '"' => {
                                end = at + 1;
                                break;
                            }
                            c => value.push(c),
                        }
                    }
                    rest = &quoted[end..];
                } else {
                    let end = after.find([';', ',']).unwrap_or(after.len());
                    value = after[..end].trim().to_owned();
                    rest = &after[end..];
                }
            }
            match key.as_str() {
                "dur" if metric.dur.is_none() => metric.dur = value.parse().ok(),
                "desc" if metric.desc.is_none() => metric.desc = Some(value),
                _ => {}
            }
        }
        if !name.is_empty() {
            metrics.entry(name).or_insert(metric);
        }
        match rest.find(',') {
            Some(comma) => rest = &rest[comma + 1..],
            None => return metrics,
        }
    }
}

#[test]
fn the_parser_reads_the_browser_format() {
    let parsed = server_timing(
        r#"miss, db;dur=53, app;dur=47.2;desc="a \"b\", c", cache;desc=hit;dur=1,db;dur=9"#,
    );
    assert_eq!(parsed["miss"], Metric::default());
    assert_eq!(
        parsed["db"].dur,
        Some(53.0),
        "the first metric of a name counts"
    );
    assert_eq!(parsed["app"].dur, Some(47.2));
    assert_eq!(parsed["app"].desc.as_deref(), Some("a \"b\", c"));
    assert_eq!(parsed["cache"].desc.as_deref(), Some("hit"));
    assert_eq!(parsed.len(), 4);
}

/// The answer's `Server-Timing`, parsed and checked: `queue`, `db` and `total`, each a
/// duration in milliseconds, neither part longer than the whole.
fn timing(reply: &Reply) -> (f64, f64, f64) {
    let header = reply
        .header("server-timing")
        .unwrap_or_else(|| panic!("no Server-Timing on {} {:?}", reply.status, reply.json()));
    let metrics = server_timing(header);
    let dur = |name: &str| {
        metrics
            .get(name)
            .and_then(|metric| metric.dur)
            .unwrap_or_else(|| panic!("no {name};dur in {header}"))
    };
    let (queue, db, total) = (dur("queue"), dur("db"), dur("total"));
    assert!(queue >= 0.0 && db >= 0.0, "{header}");
    assert!(
        queue + db <= total + 0.002,
        "the parts outgrow the whole: {header}"
    );
    (queue, db, total)
}

/// The body's stats, which must be its last member.
fn stats_last(body: &[u8]) -> Stats {
    let text = std::str::from_utf8(body).unwrap();
    let at = text
        .rfind(",\"stats\":")
        .unwrap_or_else(|| panic!("no stats: {text}"));
    let stats: Stats = serde_json::from_str(&text[at + 9..text.len() - 1])
        .unwrap_or_else(|e| panic!("stats are not the last member ({e}): {text}"));
    assert!(stats.duration_ms.unwrap() >= 0.0, "{text}");
    assert_eq!(stats.served_by, Some(ServedBy::Primary), "{text}");
    stats
}

async fn stats_and_timing_on_every_success(engine: Engine) {
    let router = engine_app!(engine);
    let name = engine.pick("sqlite", "postgresql");
    let json_ = [("content-type", "application/json")];
    let post = async |path: &str, headers: &[(&str, &str)], body: Value| {
        let reply = send(&router, "POST", path, headers, body.to_string()).await;
        assert_eq!(reply.header("sqlhttp-engine"), Some(name), "{path}");
        reply
    };
    let sql = "/api/v1/sql";
    let created = post(
        sql,
        &json_,
        json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"}),
    )
    .await;
    assert_eq!(created.status, 200, "{:?}", created.json());
    timing(&created);
    stats_last(&created.body);

    let inserted = post(
        sql,
        &json_,
        json!({"sql": "INSERT INTO t (id, v) VALUES (1, 'a'), (2, 'b'), (3, 'c')"}),
    )
    .await;
    timing(&inserted);
    assert_eq!(stats_last(&inserted.body).rows_written, Some(3));

    let read = post(
        sql,
        &json_,
        json!({"sql": "SELECT v FROM t WHERE id >= 2 ORDER BY id", "read_only": true}),
    )
    .await;
    timing(&read);
    let typed: QueryResult = serde_json::from_slice(&read.body).unwrap();
    let stats = typed.stats.unwrap();
    assert_eq!(stats.rows_written, Some(0));
    match engine {
        // At least the two rows returned.
        Engine::Sqlite => assert!(stats.rows_read.unwrap() >= 2, "{stats:?}"),
        // PostgreSQL does not count rows read per statement.
        Engine::Postgres => assert_eq!(stats.rows_read, None),
    }
    // A full scan steps through the table (N rows: N - 1 steps forward after the first),
    // however few rows it returns.
    if engine == Engine::Sqlite {
        let scan = post(
            sql,
            &json_,
            json!({"sql": "SELECT count(*) FROM t WHERE v = 'c'"}),
        )
        .await;
        assert!(stats_last(&scan.body).rows_read.unwrap() >= 2);
    }

    // A streamed body (over one chunk) ends with its stats too; its head has Server-Timing.
    let streamed = post(
        sql,
        &json_,
        json!({"sql": "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5000) \
                       SELECT x, 'some text to fill the chunk' AS s FROM n"}),
    )
    .await;
    timing(&streamed);
    let stats = stats_last(&streamed.body);
    if engine == Engine::Sqlite {
        assert!(stats.rows_read.unwrap() >= 5000, "{stats:?}");
    }

    // A batch: each result's stats, then the whole batch's, last.
    let batch = post(
        "/api/v1/batch",
        &json_,
        json!({"statements": [
            {"sql": "INSERT INTO t (id, v) VALUES (4, 'd')"},
            {"sql": "UPDATE t SET v = 'x' WHERE id <= 2"},
            {"sql": "SELECT id FROM t ORDER BY id"},
        ]}),
    )
    .await;
    assert_eq!(batch.status, 200, "{:?}", batch.json());
    timing(&batch);
    let whole = stats_last(&batch.body);
    assert_eq!(whole.rows_written, Some(3));
    let results = batch.json()["results"].clone();
    let written: Vec<Value> = (0..3)
        .map(|i| results[i]["stats"]["rows_written"].clone())
        .collect();
    assert_eq!(written, [json!(1), json!(2), json!(0)]);

    // A transaction: its statement's stats, and its commit's.
    let opened = post("/api/v1/transaction/open", &json_, json!({})).await;
    timing(&opened);
    let token = opened.json()["transaction"].clone();
    let step = post(
        "/api/v1/transaction/statement",
        &json_,
        json!({"transaction": token, "seq": 1, "sql": "DELETE FROM t WHERE id = 4"}),
    )
    .await;
    timing(&step);
    assert_eq!(stats_last(&step.body).rows_written, Some(1));
    let committed = post(
        "/api/v1/transaction/commit",
        &json_,
        json!({ "transaction": token }),
    )
    .await;
    timing(&committed);
    assert_eq!(committed.json()["outcome"], "committed");
    let stats = stats_last(&committed.body);
    assert_eq!((stats.rows_read, stats.rows_written), (None, None));

    // A keyed write's replay answers the first execution's body, stats included; its
    // Server-Timing is its own.
    let keyed = [json_[0], ("idempotency-key", "stats-1")];
    let body = json!({"sql": "INSERT INTO t (id, v) VALUES (9, 'k')"});
    let first = post(sql, &keyed, body.clone()).await;
    let again = post(sql, &keyed, body).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body, "the stored body, stats included");
    assert_eq!(stats_last(&again.body).rows_written, Some(1));
    timing(&again);

    // An error has no Server-Timing, but names its engine.
    let failed = post(sql, &json_, json!({"sql": "SELECT * FROM nowhere"})).await;
    assert_eq!(failed.status, 400);
    assert_eq!(failed.header("server-timing"), None);
    // Probes name the engine too.
    let probe = send(&router, "GET", "/healthz", &[], "").await;
    assert_eq!(probe.header("sqlhttp-engine"), Some(name));
}

on_both_engines!(stats_and_timing_on_every_success);
