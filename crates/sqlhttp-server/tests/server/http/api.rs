//! The HTTP protocol around the statements, in-process: routing, methods, malformed and
//! undeclared bodies, authentication and the body limit. What a statement answers is
//! `sql/answers.rs`.

use serde_json::json;
use sqlhttp_server::Config;

use crate::common::{app_with, memory_app, post_with, send};

#[tokio::test]
async fn healthz_is_open_and_plain() {
    let router = app_with(&Config {
        tokens: vec!["t".into()],
        ..Config::default()
    });
    let reply = send(&router, "GET", "/healthz", &[], "").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"ok");
    let reply = send(&router, "POST", "/healthz", &[], "").await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.code(), "METHOD_NOT_ALLOWED");
    assert_eq!(reply.header("allow"), Some("GET, HEAD"));
}

#[tokio::test]
async fn unknown_paths_are_json_404() {
    let router = memory_app();
    for path in ["/", "/api/v1/sql/", "/api/v2/sql", "/nope"] {
        let reply = send(&router, "POST", path, &[], "{}").await;
        assert_eq!(reply.status, 404, "{path}");
        assert_eq!(reply.code(), "NOT_FOUND");
        assert_eq!(reply.header("content-type"), Some("application/json"));
    }
}

#[tokio::test]
async fn other_methods_on_the_sql_endpoint_are_405_with_allow() {
    let router = memory_app();
    for method in ["GET", "PUT", "DELETE", "PATCH", "HEAD"] {
        let reply = send(&router, method, "/api/v1/sql", &[], "").await;
        assert_eq!(reply.status, 405, "{method}");
        assert_eq!(reply.header("allow"), Some("POST"), "{method}");
        if method != "HEAD" {
            assert_eq!(reply.code(), "METHOD_NOT_ALLOWED");
        }
    }
}

#[tokio::test]
async fn malformed_requests_are_bad_request() {
    let router = memory_app();
    let bodies = [
        "not json".to_owned(),
        String::new(),
        "[]".to_owned(),
        json!({"params": []}).to_string(),
        json!({"sql": 1}).to_string(),
        json!({"sql": "SELECT ?", "params": [[1]]}).to_string(),
        json!({"sql": "SELECT ?", "params": [{"a": 1}]}).to_string(),
        r#"{"sql": "SELECT ?", "params": [9223372036854775808]}"#.to_owned(),
        r#"{"sql": "SELECT ?", "params": [-9223372036854775809]}"#.to_owned(),
    ];
    for body in bodies {
        let reply = send(&router, "POST", "/api/v1/sql", JSON, body.clone()).await;
        assert_eq!(reply.status, 400, "{body}");
        assert_eq!(reply.code(), "BAD_REQUEST", "{body}");
    }
}

#[tokio::test]
async fn bearer_tokens_guard_the_sql_endpoint() {
    let router = app_with(&Config {
        tokens: vec!["alpha".into(), "beta".into()],
        ..Config::default()
    });
    let body = json!({"sql": "SELECT 1"});
    for headers in [
        vec![],
        vec![("authorization", "Bearer gamma")],
        vec![("authorization", "Basic YWxwaGE6")],
        vec![("authorization", "alpha")],
    ] {
        let reply = post_with(&router, &headers, &body).await;
        assert_eq!(reply.status, 401, "{headers:?}");
        assert_eq!(reply.code(), "UNAUTHORIZED");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    }
    for token in ["Bearer alpha", "Bearer beta"] {
        let reply = post_with(&router, &[("authorization", token)], &body).await;
        assert_eq!(reply.status, 200, "{token}");
    }
}

#[tokio::test]
async fn auth_is_checked_before_the_body_is_read() {
    let router = app_with(&Config {
        tokens: vec!["alpha".into()],
        max_body_bytes: 16,
        ..Config::default()
    });
    let reply = send(&router, "POST", "/api/v1/sql", &[], "x".repeat(1000)).await;
    assert_eq!(reply.status, 401);
}

#[tokio::test]
async fn oversized_bodies_are_413_with_a_json_body() {
    let router = app_with(&Config {
        max_body_bytes: 64,
        ..Config::default()
    });
    let fits = json!({"sql": "SELECT 1"}).to_string();
    assert_eq!(
        send(&router, "POST", "/api/v1/sql", JSON, fits)
            .await
            .status,
        200
    );
    let big = json!({"sql": format!("SELECT '{}'", "x".repeat(100))}).to_string();
    let reply = send(&router, "POST", "/api/v1/sql", JSON, big).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.code(), "PAYLOAD_TOO_LARGE");
    assert_eq!(reply.header("content-type"), Some("application/json"));
}

/// The headers of a JSON POST.
const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

#[tokio::test]
async fn a_body_not_declared_as_json_is_415() {
    let router = memory_app();
    let body = json!({"sql": "SELECT 1"}).to_string();
    for headers in [
        &[][..],
        &[("content-type", "text/plain")][..],
        &[("content-type", "application/x-www-form-urlencoded")][..],
    ] {
        let reply = send(&router, "POST", "/api/v1/sql", headers, body.clone()).await;
        assert_eq!(reply.status, 415, "{headers:?}");
        assert_eq!(reply.code(), "UNSUPPORTED_MEDIA_TYPE");
    }
    let charset = [("content-type", "application/json; charset=utf-8")];
    assert_eq!(
        send(&router, "POST", "/api/v1/sql", &charset, body)
            .await
            .status,
        200
    );
}
