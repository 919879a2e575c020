//! The OpenAPI document (`docs/openapi.yaml`, served at `GET /api/v1/openapi.json`) against the
//! server: the error codes and the routes of the source are the document's, and real answers
//! (success, errors, streamed, batch, describe, probes) validate against its schemas, checked by
//! the small validator of `http/openapi_schema.rs` (ADR 0030).
//!
//! Knows the document, the public HTTP API, the protocol crate's error table and paths, and where
//! the source keeps its routes (`src/http/*.rs`); nothing about the engines.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sqlhttp_server::{Config, HttpLimits};

use crate::common::{app_with, send};
use crate::engines::{Engine, on_both_engines};
use crate::http::openapi_schema::{conforms, document, document_on, source};

/// The crate's directory.
const CRATE: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn every_error_code_is_in_the_document_and_the_other_way_round() {
    // The error table is the protocol crate's (ADR 0048), which the server answers with.
    let codes: BTreeSet<String> = sqlhttp_protocol::ErrorCode::ALL
        .iter()
        .map(|code| code.as_str().to_owned())
        .collect();
    let doc = document();
    let documented: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|code| code.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(codes, documented);

    // Each code is documented on at least one response, and each response's codes are real.
    let mut on_responses = BTreeSet::new();
    for response in doc["components"]["responses"].as_object().unwrap().values() {
        let schema = &response["content"]["application/json"]["schema"];
        for code in schema["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"]
            .as_array()
            .unwrap()
        {
            assert!(documented.contains(code.as_str().unwrap()), "{code}");
            on_responses.insert(code.as_str().unwrap().to_owned());
        }
    }
    // NOT_FOUND and METHOD_NOT_ALLOWED answer paths and methods the document does not list.
    let unlisted: BTreeSet<String> = ["NOT_FOUND", "METHOD_NOT_ALLOWED"].map(String::from).into();
    assert_eq!(
        documented
            .difference(&on_responses)
            .cloned()
            .collect::<BTreeSet<_>>(),
        unlisted
    );

    let kinds: BTreeSet<String> = sqlhttp_protocol::Constraint::ALL
        .map(|kind| kind.as_str().to_owned())
        .into();
    let documented_kinds: BTreeSet<String> =
        doc["components"]["schemas"]["ErrorObject"]["properties"]["constraint"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|kind| kind.as_str().unwrap().to_owned())
            .collect();
    assert_eq!(kinds, documented_kinds);
}

/// The `(method, path)` pairs the router has: each `(PATH, || get(..)|post(..)...)` entry of the
/// `ROUTES` table the router is built from (`src/http/mod.rs`), and each `.route(PATH,
/// get(..)|post(..))` of the HTTP sources (a unit test's), with path constants resolved.
fn source_routes() -> BTreeSet<(String, String)> {
    let dir = format!("{CRATE}/src/http");
    let sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    // A path constant is a literal, or one of the protocol crate's (ADR 0048).
    let protocol_path = |name: &str| -> Option<&str> {
        use sqlhttp_protocol::path;
        Some(match name {
            "SQL" => path::SQL,
            "BATCH" => path::BATCH,
            "DESCRIBE" => path::DESCRIBE,
            "DESCRIBE_STATEMENT" => path::DESCRIBE_STATEMENT,
            "TRANSACTION_OPEN" => path::TRANSACTION_OPEN,
            "TRANSACTION_STATEMENT" => path::TRANSACTION_STATEMENT,
            "TRANSACTION_COMMIT" => path::TRANSACTION_COMMIT,
            "TRANSACTION_ROLLBACK" => path::TRANSACTION_ROLLBACK,
            "TRANSACTION_OUTCOME" => path::TRANSACTION_OUTCOME,
            "OPENAPI" => path::OPENAPI,
            _ => return None,
        })
    };
    let constant = |name: &str| -> String {
        let needle = format!("const {name}: &str = ");
        sources
            .iter()
            .find_map(|source| {
                let from = source.find(&needle)? + needle.len();
                let value = source[from..from + source[from..].find(';')?].trim();
                match value.strip_prefix('"') {
                    Some(literal) => Some(literal.trim_end_matches('"').to_owned()),
                    None => protocol_path(value.strip_prefix("sqlhttp_protocol::path::")?)
                        .map(str::to_owned),
                }
            })
            .unwrap_or_else(|| panic!("no constant {name}"))
    };
    let resolve = |path: &str| match path.strip_prefix('"') {
        Some(literal) => literal.trim_end_matches('"').to_owned(),
        None => constant(path.rsplit("::").next().unwrap()),
    };
    let method_of = |handler: &str| {
        let method = handler[..handler.find('(').unwrap()].to_owned();
        assert!(["get", "post"].contains(&method.as_str()), "{method}");
        method
    };
    let mut routes = BTreeSet::new();
    for source in &sources {
        if let Some(start) = source.find("const ROUTES") {
            let table = &source[start..];
            let table: String = table[..table.find("];").unwrap()]
                .split_whitespace()
                .collect();
            // Entries read `(PATH,||post(handler)...)` or `(PATH,||{get(handler)...})`.
            for entry in table.split(",||").skip(1).zip(table.split(",||")) {
                let (handler, before) = entry;
                let path = &before[before.rfind('(').unwrap() + 1..];
                routes.insert((method_of(handler.trim_start_matches('{')), resolve(path)));
            }
        }
        for call in source.split(".route(").skip(1) {
            let call: String = call.split_whitespace().collect::<Vec<_>>().join("");
            let (path, handler) = call.split_once(',').unwrap();
            if path == "path" {
                // The router built from the table above.
                continue;
            }
            routes.insert((method_of(handler), resolve(path)));
        }
    }
    assert!(routes.len() > 10, "the routes were not found: {routes:?}");
    routes
}

#[test]
fn every_route_is_in_the_document_and_the_other_way_round() {
    let doc = document();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let routes = source_routes();
    // The unit test in src/http/mod.rs routes a `/boom`; it is no route of the app.
    let app_routes: BTreeSet<_> = routes.into_iter().filter(|(_, p)| p != "/boom").collect();
    assert_eq!(app_routes, documented);
}

#[tokio::test]
async fn every_documented_operation_is_answered_and_the_document_is_served_without_a_token() {
    let doc = document();
    let router = app_with(&Config {
        tokens: vec!["tok-9f3a".into()],
        ..Config::default()
    });
    let served = send(&router, "GET", "/api/v1/openapi.json", &[], "").await;
    assert_eq!(served.status, 200);
    assert_eq!(served.json(), doc, "the served document is the file");
    assert!(!String::from_utf8_lossy(&served.body).contains("tok-9f3a"));
    conforms(&doc, "GET", "/api/v1/openapi.json", &served);

    let auth = [
        ("authorization", "Bearer tok-9f3a"),
        ("content-type", "application/json"),
    ];
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let body = if method == "post" { "{}" } else { "" };
            let reply = send(&router, &method.to_ascii_uppercase(), path, &auth, body).await;
            assert!(
                reply.status != 404 && reply.status != 405,
                "{method} {path}: {}",
                reply.status
            );
            conforms(&doc, method, path, &reply);
        }
    }
}

#[tokio::test]
async fn real_answers_validate_against_the_document() {
    let doc = document();
    let router = app_with(&Config {
        tokens: vec!["rw".into()],
        read_tokens: vec!["ro".into()],
        ..Config::default()
    });
    let rw = [
        ("authorization", "Bearer rw"),
        ("content-type", "application/json"),
    ];
    let ro = [
        ("authorization", "Bearer ro"),
        ("content-type", "application/json"),
    ];
    let post = async |headers: &[(&str, &str)], path: &str, body: Value| {
        let reply = send(&router, "POST", path, headers, body.to_string()).await;
        conforms(&doc, "POST", path, &reply);
        reply
    };
    let sql = "/api/v1/sql";
    let setup = post(
        &rw,
        sql,
        json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT UNIQUE, b BLOB, r REAL)"}),
    )
    .await;
    assert_eq!(setup.status, 200);
    let insert = post(
        &rw,
        sql,
        json!({"sql": "INSERT INTO t VALUES (?, ?, ?, ?) RETURNING *",
               "params": [1, "a", {"base64": "AAEC"}, 1.5]}),
    )
    .await;
    assert_eq!(insert.json()["last_insert_id"], 1);
    let keyed = [rw[0], rw[1], ("idempotency-key", "k-1")];
    let body = json!({"sql": "INSERT INTO t (name) VALUES ('b')"});
    post(&keyed, sql, body.clone()).await;
    let replayed = post(&keyed, sql, body).await;
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    let reused = post(&keyed, sql, json!({"sql": "SELECT 1"})).await;
    assert_eq!(reused.code(), "IDEMPOTENCY_KEY_REUSED");

    let errors = [
        (
            &rw[..],
            json!({"sql": "SELECT * FROM nowhere"}),
            "SQL_ERROR",
        ),
        (&rw[..], json!({"sql": 1}), "BAD_REQUEST"),
        (
            &rw[..],
            json!({"sql": "SELECT ?", "params": [[1]]}),
            "BAD_REQUEST",
        ),
        (
            &rw[..],
            json!({"sql": "INSERT INTO t (name) VALUES ('a')"}),
            "CONSTRAINT_VIOLATION",
        ),
        (&ro[..], json!({"sql": "DELETE FROM t"}), "READ_ONLY"),
        (
            &rw[..],
            json!({"sql": "ATTACH 'x' AS x"}),
            "STATEMENT_NOT_ALLOWED",
        ),
        (&[rw[1]][..], json!({"sql": "SELECT 1"}), "UNAUTHORIZED"),
        (
            &[rw[0]][..],
            json!({"sql": "SELECT 1"}),
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        (
            &[rw[0], rw[1], ("origin", "https://evil.example")][..],
            json!({"sql": "SELECT 1"}),
            "ORIGIN_NOT_ALLOWED",
        ),
        (
            &[rw[0], rw[1], ("idempotency-key", "has space")][..],
            json!({"sql": "SELECT 1"}),
            "BAD_REQUEST",
        ),
    ];
    for (headers, body, code) in errors {
        assert_eq!(
            post(headers, sql, body.clone()).await.code(),
            code,
            "{body}"
        );
    }
    // A statement's description, and its refusals.
    let statement = "/api/v1/describe/statement";
    let query = json!({"sql": "SELECT id, name, r + 1 AS x FROM t WHERE id = ?"});
    assert_eq!(post(&ro, statement, query).await.status, 200);
    let refused = post(&ro, statement, json!({"sql": "DELETE FROM t"})).await;
    assert_eq!(refused.code(), "READ_ONLY");
    assert_eq!(
        post(&rw, statement, json!({"sql": " "})).await.code(),
        "SQL_ERROR"
    );
    let unknown = post(&rw, statement, json!({"sql": "SELECT 1", "params": []})).await;
    assert_eq!(unknown.code(), "BAD_REQUEST");

    let too_large = send(
        &router,
        "POST",
        sql,
        &rw,
        format!(r#"{{"sql": "SELECT '{}'"}}"#, "x".repeat(7 << 20)),
    )
    .await;
    conforms(&doc, "POST", sql, &too_large);
    assert_eq!(too_large.code(), "PAYLOAD_TOO_LARGE");

    // Streamed: a body over one chunk, and one whose rows end in an error (integer overflow).
    let streamed = post(
        &rw,
        sql,
        json!({"sql": "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5000) \
                       SELECT x, 'some text to fill the chunk' AS s FROM n"}),
    )
    .await;
    assert_eq!(streamed.json()["rows"].as_array().unwrap().len(), 5000);
    let failed = post(
        &rw,
        sql,
        json!({"sql": "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5000) \
                       SELECT CASE WHEN x < 4000 THEN x ELSE abs(-9223372036854775807 - 1) END AS v, \
                       'some text to fill the chunk' AS s FROM n"}),
    )
    .await;
    assert_eq!(failed.status, 200);
    assert_eq!(
        failed.json()["error"]["code"],
        "SQL_ERROR",
        "a streamed failure"
    );

    let batch = "/api/v1/batch";
    let results = post(
        &rw,
        batch,
        json!({"statements": [{"sql": "INSERT INTO t (name) VALUES (?)", "params": ["c"]},
                              {"sql": "SELECT id, name FROM t ORDER BY id"}]}),
    )
    .await;
    assert_eq!(results.json()["results"].as_array().unwrap().len(), 2);
    let at = post(
        &rw,
        batch,
        json!({"statements": [{"sql": "SELECT 1"}, {"sql": "INSERT INTO t (name) VALUES ('a')"}]}),
    )
    .await;
    assert_eq!(at.json()["error"]["statement"], 1);
    assert_eq!(
        post(&rw, batch, json!({"statements": []})).await.code(),
        "BAD_REQUEST"
    );
    assert_eq!(
        post(
            &ro,
            batch,
            json!({"statements": [{"sql": "DELETE FROM t"}]})
        )
        .await
        .code(),
        "READ_ONLY"
    );

    let describe = "/api/v1/describe";
    let tables = post(&ro, describe, json!({})).await;
    assert_eq!(tables.json()["rows"][0][0], "t");
    let columns = post(&ro, describe, json!({"table": "t"})).await;
    assert_eq!(columns.json()["rows"].as_array().unwrap().len(), 4);
    assert_eq!(
        post(&ro, describe, json!({"table": ""})).await.code(),
        "BAD_REQUEST"
    );
    assert_eq!(
        post(&ro, describe, json!({"other": 1})).await.code(),
        "BAD_REQUEST"
    );

    for path in ["/healthz", "/readyz", "/metrics", "/api/v1/openapi.json"] {
        let reply = send(&router, "GET", path, &[], "").await;
        assert_eq!(reply.status, 200, "{path}");
        conforms(&doc, "GET", path, &reply);
    }
}

#[tokio::test]
async fn an_options_request_that_is_no_preflight_is_routed_like_any_other_method() {
    // Found by Schemathesis: every OPTIONS, on any path, was answered `200` with an empty body
    // by the CORS layer, before authentication and routing.
    let router = app_with(&Config {
        tokens: vec!["rw".into()],
        http: HttpLimits {
            allow_origins: vec!["https://app.example".into()],
            ..HttpLimits::default()
        },
        ..Config::default()
    });
    let auth = [("authorization", "Bearer rw")];
    let sql = send(&router, "OPTIONS", "/api/v1/sql", &auth, "").await;
    assert_eq!(
        (sql.status, sql.code().as_str()),
        (405, "METHOD_NOT_ALLOWED")
    );
    assert_eq!(sql.header("allow"), Some("POST"));
    let probe = send(&router, "OPTIONS", "/healthz", &[], "").await;
    assert_eq!(
        (probe.status, probe.code().as_str()),
        (405, "METHOD_NOT_ALLOWED")
    );
    let unknown = send(&router, "OPTIONS", "/nowhere", &[], "").await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (404, "NOT_FOUND")
    );
    let anonymous = send(&router, "OPTIONS", "/api/v1/sql", &[], "").await;
    assert_eq!(anonymous.code(), "UNAUTHORIZED");

    // A browser's preflight from a listed origin is still the CORS layer's.
    let preflight = send(
        &router,
        "OPTIONS",
        "/api/v1/sql",
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "POST"),
        ],
        "",
    )
    .await;
    assert_eq!(preflight.status, 200);
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some("https://app.example")
    );
}

#[tokio::test]
async fn a_describe_body_is_an_object_never_an_array() {
    // Found while fuzzing from the document: serde reads a struct from a JSON array too, so
    // `["t"]` described table `t` and `[null]` listed the tables, though the document (and the
    // protocol) say the body is an object.
    let doc = document();
    let router = app_with(&Config::default());
    for body in [r#"["t"]"#, "[null]", " [] "] {
        let reply = send(
            &router,
            "POST",
            "/api/v1/describe",
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(
            (reply.status, reply.code().as_str()),
            (400, "BAD_REQUEST"),
            "{body}"
        );
        conforms(&doc, "POST", "/api/v1/describe", &reply);
    }
}

/// Issue 36, finding 16: Schemathesis's positive-data check found the document promising what
/// the server refuses. Each engine's server now serves a document listing exactly the isolation
/// levels it takes (SQLite: `serializable` only; PostgreSQL: all three) and the `foreign_keys`
/// it takes (PostgreSQL: `enforced` only), and every value the served document lists is
/// accepted while every value it leaves out is refused.
async fn each_engine_documents_the_levels_it_accepts(engine: Engine) {
    let Some(router) = engine.app(|_| {}).await else {
        return;
    };
    let name = engine.pick("sqlite", "postgresql");
    let served = send(&router, "GET", "/api/v1/openapi.json", &[], "").await;
    assert_eq!(served.status, 200);
    let served = served.json();
    assert_eq!(served, document_on(name), "{name}: the served document");
    assert!(
        !served.to_string().contains("\"x-"),
        "{name}: engine members served"
    );
    let source = source();
    let schemas = |doc: &Value, schema: &str, property: &str| -> Vec<Value> {
        doc["components"]["schemas"][schema]["properties"][property]["enum"]
            .as_array()
            .unwrap()
            .clone()
    };
    let json = [("content-type", "application/json")];
    // A batch's isolation and foreign keys.
    for (property, listed, statement) in [
        (
            "isolation",
            schemas(&served, "BatchRequest", "isolation"),
            "SELECT 1",
        ),
        (
            "foreign_keys",
            schemas(&served, "BatchRequest", "foreign_keys"),
            "CREATE TABLE IF NOT EXISTS fk (i INTEGER)",
        ),
    ] {
        for value in schemas(&source, "BatchRequest", property) {
            let body = json!({"statements": [{"sql": statement}], property: value}).to_string();
            let reply = send(&router, "POST", "/api/v1/batch", &json, body).await;
            let expected = if listed.contains(&value) { 200 } else { 400 };
            assert_eq!(
                reply.status,
                expected,
                "{name}: {property} {value}: {:?}",
                reply.json()
            );
        }
    }
    // A transaction's isolation.
    let listed = schemas(&served, "TransactionOpenRequest", "isolation");
    assert_eq!(listed, schemas(&served, "TransactionOpened", "isolation"));
    for value in schemas(&source, "TransactionOpenRequest", "isolation") {
        let body = json!({ "isolation": value }).to_string();
        let reply = send(&router, "POST", "/api/v1/transaction/open", &json, body).await;
        if !listed.contains(&value) {
            assert_eq!(reply.status, 400, "{name}: open {value}");
            continue;
        }
        assert_eq!(
            reply.status,
            200,
            "{name}: open {value}: {:?}",
            reply.json()
        );
        let opened = reply.json();
        assert_eq!(opened["isolation"], value);
        let body = json!({ "transaction": opened["transaction"] }).to_string();
        let reply = send(&router, "POST", "/api/v1/transaction/rollback", &json, body).await;
        assert_eq!(reply.status, 200, "{name}: rollback");
    }
}

on_both_engines!(each_engine_documents_the_levels_it_accepts);

/// Issue 36, finding 16: `{"sql": ""}` was documented as valid and answered 400. A statement's
/// text is now documented as at least one character, not all whitespace, and such text is
/// refused on every endpoint that takes one.
#[tokio::test]
async fn an_empty_statement_is_documented_as_refused() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    for schema in [
        "SqlRequest",
        "BatchStatement",
        "TransactionStatementRequest",
    ] {
        let sql = &schemas[schema]["properties"]["sql"];
        assert_eq!(sql["minLength"], 1, "{schema}");
        assert_eq!(sql["pattern"], "\\S", "{schema}");
    }
    let router = app_with(&Config::default());
    let json = [("content-type", "application/json")];
    for text in ["", " ", "\n\t  "] {
        let reply = send(
            &router,
            "POST",
            "/api/v1/sql",
            &json,
            json!({ "sql": text }).to_string(),
        )
        .await;
        assert_eq!(reply.status, 400, "{text:?}");
        conforms(&doc, "POST", "/api/v1/sql", &reply);
        let body = json!({"statements": [{ "sql": text }]}).to_string();
        let reply = send(&router, "POST", "/api/v1/batch", &json, body).await;
        assert_eq!(reply.status, 400, "{text:?}");
        conforms(&doc, "POST", "/api/v1/batch", &reply);
    }
}

/// Found by Schemathesis's positive-data check (issue 36, finding 16): JSON Schema reads `1.0` as
/// the integer 1, and the document's `seq` is an integer from 1 to 2^53 - 1; the server refused
/// `1.0` and took numbers past the bound. Now it takes exactly what the document says.
#[tokio::test]
async fn a_seq_is_any_json_integer_within_the_documented_bound() {
    let doc = document();
    let seq = &doc["components"]["schemas"]["TransactionStatementRequest"]["properties"]["seq"];
    assert_eq!(seq["maximum"], 9_007_199_254_740_991_u64);
    let router = app_with(&Config::default());
    let json = [("content-type", "application/json")];
    let opened = send(&router, "POST", "/api/v1/transaction/open", &json, "{}").await;
    assert_eq!(opened.status, 200);
    let token = opened.json()["transaction"].clone();
    for (seq, status) in [
        (json!(9_007_199_254_740_992_u64), 400),
        (json!(0), 400),
        (json!(1.5), 400),
        (json!(1.0), 200),
    ] {
        let body = json!({"transaction": token, "seq": seq, "sql": "SELECT 1"}).to_string();
        let reply = send(
            &router,
            "POST",
            "/api/v1/transaction/statement",
            &json,
            body,
        )
        .await;
        assert_eq!(reply.status, status, "seq {seq}: {:?}", reply.json());
        conforms(&doc, "POST", "/api/v1/transaction/statement", &reply);
    }
    let body = json!({ "transaction": token }).to_string();
    let reply = send(&router, "POST", "/api/v1/transaction/rollback", &json, body).await;
    assert_eq!(reply.status, 200);
}
