//! `docs/openapi.yaml` (the protocol's machine-readable contract) held to this crate: every header
//! name, error code with its status, isolation name, endpoint path and body's members (and which
//! are required) that the document states must be the crate's, both ways, so neither can drift.
//!
//! Reads the document from the repository at run time (a packaged crate carries no document; the
//! test is the repository's). It is written in YAML's JSON form (ADR 0030): JSON from its first
//! brace.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sqlhttp_protocol::body::{self, Schema};
use sqlhttp_protocol::{Constraint, ErrorCode, Isolation, header, path};

fn document() -> Value {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.yaml");
    let text = std::fs::read_to_string(file).expect("docs/openapi.yaml is readable");
    let json = &text[text.find('{').expect("the document has a JSON part")..];
    serde_json::from_str(json).expect("the document is JSON from its first brace")
}

fn strings(value: &Value) -> BTreeSet<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("an array: {value}"))
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn set<'a>(items: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    items.into_iter().map(str::to_owned).collect()
}

/// Follows a `$ref` inside the document.
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(reference) => doc
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{reference} resolves")),
        None => value,
    }
}

#[test]
fn the_error_codes_are_the_crate_s() {
    let doc = document();
    let listed = strings(&doc["components"]["schemas"]["ErrorCode"]["enum"]);
    let ours = set(ErrorCode::ALL.iter().map(|code| code.as_str()));
    assert_eq!(listed, ours, "ErrorCode's enum against ErrorCode::ALL");
}

/// Every response the paths answer with a status names its codes; each code has that status,
/// and every code is answered somewhere. A code that comes with `Retry-After` is in a response
/// that documents the header.
#[test]
fn each_code_has_its_status_and_retry_after() {
    let doc = document();
    let mut statuses: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    let mut with_retry_after: BTreeSet<String> = BTreeSet::new();
    for (route, operations) in doc["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let Some(responses) = operation.get("responses").and_then(Value::as_object) else {
                continue;
            };
            for (status, response) in responses {
                let Ok(status) = status.parse::<u16>() else {
                    continue;
                };
                let response = resolve(&doc, response);
                let Some(schema) = response.pointer("/content/application~1json/schema") else {
                    continue;
                };
                let Some(parts) = schema.get("allOf").and_then(Value::as_array) else {
                    continue;
                };
                for part in parts {
                    let Some(codes) = part.pointer("/properties/error/properties/code/enum") else {
                        continue;
                    };
                    for code in strings(codes) {
                        statuses.entry(code.clone()).or_default().insert(status);
                        if response.pointer("/headers/Retry-After").is_some() {
                            with_retry_after.insert(code.clone());
                        }
                        let known: ErrorCode = code
                            .parse()
                            .unwrap_or_else(|_| panic!("{method} {route}: {code} is a code"));
                        assert_eq!(
                            known.status(),
                            status,
                            "{method} {route} answers {code} with {status}"
                        );
                    }
                }
            }
        }
    }
    // Codes no listed operation answers (any other path, any other method) are stated in the
    // document's description, with their status.
    let description = doc["info"]["description"].as_str().unwrap_or_default();
    for &code in ErrorCode::ALL {
        assert!(
            statuses.contains_key(code.as_str())
                || description.contains(&format!("`{} {code}`", code.status())),
            "{code} is answered by no path in the document, nor stated with its status"
        );
        if code.sends_retry_after() {
            assert!(
                with_retry_after.contains(code.as_str()),
                "{code} comes with Retry-After, which its responses do not document"
            );
        }
    }
}

#[test]
fn the_header_names_are_the_crate_s() {
    let doc = document();
    let mut named = BTreeSet::new();
    // Response headers are named by their keys where they are used; request headers by `name`.
    let mut collect = |value: &Value| {
        if let Some(headers) = value.get("headers").and_then(Value::as_object) {
            named.extend(headers.keys().map(|name| name.to_ascii_lowercase()));
        }
    };
    for (_, operations) in doc["paths"].as_object().unwrap() {
        for (_, operation) in operations.as_object().unwrap() {
            for (_, response) in operation["responses"].as_object().into_iter().flatten() {
                collect(resolve(&doc, response));
            }
        }
    }
    for (_, parameter) in doc["components"]["parameters"].as_object().unwrap() {
        if parameter["in"] == "header" {
            named.insert(parameter["name"].as_str().unwrap().to_ascii_lowercase());
        }
    }
    // HTTP's own headers are `http`'s, not the protocol's.
    for http_s in ["retry-after", "www-authenticate", "allow", "content-type"] {
        named.remove(http_s);
    }
    assert_eq!(
        named,
        set(header::ALL),
        "the document's headers against header::ALL"
    );
    let parameters = &doc["components"]["parameters"];
    assert_eq!(
        strings(&parameters["SqlhttpConsistency"]["schema"]["enum"]),
        set([header::CONSISTENCY_SESSION, header::CONSISTENCY_PRIMARY])
    );
    assert_eq!(
        strings(&doc["components"]["headers"]["SqlhttpServedBy"]["schema"]["enum"]),
        set([header::SERVED_BY_PRIMARY, header::SERVED_BY_REPLICA])
    );
    assert_eq!(
        strings(&doc["components"]["headers"]["SqlhttpEngine"]["schema"]["enum"]),
        set([header::ENGINE_SQLITE, header::ENGINE_POSTGRESQL])
    );
}

#[test]
fn the_isolation_names_are_the_crate_s() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let ours = set(Isolation::ALL.map(Isolation::as_str));
    for (schema, member) in [
        ("TransactionOpenRequest", "isolation"),
        ("TransactionOpened", "isolation"),
        ("BatchRequest", "isolation"),
    ] {
        let listed = strings(&schemas[schema]["properties"][member]["enum"]);
        assert_eq!(listed, ours, "{schema}.{member}");
    }
}

#[test]
fn the_paths_are_the_crate_s() {
    let doc = document();
    let listed: BTreeSet<String> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|route| route.starts_with(path::API_PREFIX))
        .cloned()
        .collect();
    let ours = set([
        path::SQL,
        path::BATCH,
        path::DESCRIBE,
        path::DESCRIBE_STATEMENT,
        path::TRANSACTION_OPEN,
        path::TRANSACTION_STATEMENT,
        path::TRANSACTION_COMMIT,
        path::TRANSACTION_ROLLBACK,
        path::TRANSACTION_OUTCOME,
        path::OPENAPI,
    ]);
    assert_eq!(listed, ours);
}

fn check_schema<T: Schema>(doc: &Value) {
    let schema = &doc["components"]["schemas"][T::NAME];
    assert!(schema.is_object(), "the document has no schema {}", T::NAME);
    let members: BTreeSet<String> = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{} has properties", T::NAME))
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        members,
        set(T::MEMBERS.iter().copied()),
        "{}'s members",
        T::NAME
    );
    let required = schema.get("required").map(strings).unwrap_or_default();
    assert_eq!(
        required,
        set(T::REQUIRED.iter().copied()),
        "{}'s required members",
        T::NAME
    );
}

#[test]
fn the_bodies_members_and_required_sets_are_the_crate_s() {
    let doc = document();
    check_schema::<body::SqlRequest>(&doc);
    check_schema::<body::BatchRequest>(&doc);
    check_schema::<body::BatchResponse>(&doc);
    check_schema::<body::DescribeRequest>(&doc);
    check_schema::<body::Column>(&doc);
    check_schema::<body::DescribeStatementRequest>(&doc);
    check_schema::<body::StatementDescription>(&doc);
    check_schema::<body::ParamDescription>(&doc);
    check_schema::<body::ColumnDescription>(&doc);
    check_schema::<body::QueryResult>(&doc);
    check_schema::<body::StreamedFailure>(&doc);
    check_schema::<body::ErrorBody>(&doc);
    check_schema::<body::ErrorObject>(&doc);
    check_schema::<body::TransactionOpenRequest>(&doc);
    check_schema::<body::TransactionOpened>(&doc);
    check_schema::<body::TransactionStatementRequest>(&doc);
    check_schema::<body::TransactionNamed>(&doc);
    check_schema::<body::TransactionOutcome>(&doc);
    check_schema::<body::Stats>(&doc);

    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        strings(&schemas["ErrorObject"]["properties"]["constraint"]["enum"]),
        set(Constraint::ALL.map(Constraint::as_str))
    );
    assert_eq!(
        strings(&schemas["BatchRequest"]["properties"]["foreign_keys"]["enum"]),
        set(body::ForeignKeys::ALL.map(body::ForeignKeys::as_str))
    );
    assert_eq!(
        strings(&schemas["TransactionOutcome"]["properties"]["outcome"]["enum"]),
        set(body::Outcome::ALL.map(body::Outcome::as_str))
    );
    assert_eq!(
        strings(&schemas["Stats"]["properties"]["served_by"]["enum"]),
        set([body::ServedBy::Primary, body::ServedBy::Replica].map(body::ServedBy::as_str))
    );
    // A batch statement is a statement's body.
    let statement: BTreeSet<String> = schemas["BatchStatement"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        statement,
        set(body::SqlRequest::<String>::MEMBERS.iter().copied())
    );
    let blob: BTreeSet<String> = schemas["Blob"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(blob, set([body::member::BASE64]));
}
