//! Every status and error code of the protocol, as a caller sees it through `Error`.

use std::time::Duration;

use serde_json::json;
use sqlhttp::{ConstraintKind, ErrorKind};
use wiremock::ResponseTemplate;

use crate::support::*;

async fn failure(response: ResponseTemplate) -> sqlhttp::Error {
    let server = server().await;
    respond_always(&server, response).await;
    let client = client_with(&server, quick(1));
    client
        .query("SELECT 1")
        .fetch_all::<i64>()
        .await
        .unwrap_err()
}

#[tokio::test]
async fn sql_error() {
    let err = failure(error(400, "SQL_ERROR", "near \"SELEC\": syntax error")).await;
    assert_eq!(
        err.kind(),
        &ErrorKind::Sql {
            code: "SQL_ERROR".into(),
            message: "near \"SELEC\": syntax error".into()
        }
    );
    assert_eq!(
        (err.status(), err.code(), err.is_retryable()),
        (Some(400), Some("SQL_ERROR"), false)
    );
}

#[tokio::test]
async fn bad_request() {
    let err = failure(error(400, "BAD_REQUEST", "`sql` is missing")).await;
    assert_eq!(
        err.kind(),
        &ErrorKind::Http {
            status: 400,
            code: Some("BAD_REQUEST".into()),
            message: "`sql` is missing".into()
        }
    );
}

#[tokio::test]
async fn unauthorized() {
    let err = failure(
        error(401, "UNAUTHORIZED", "bad token").insert_header("www-authenticate", "Bearer"),
    )
    .await;
    assert_eq!(
        err.kind(),
        &ErrorKind::Unauthorized {
            message: "bad token".into()
        }
    );
    assert_eq!(err.status(), Some(401));
}

#[tokio::test]
async fn not_found_and_method_not_allowed() {
    let err = failure(error(404, "NOT_FOUND", "no such path")).await;
    assert_eq!((err.status(), err.code()), (Some(404), Some("NOT_FOUND")));
    let err = failure(error(405, "METHOD_NOT_ALLOWED", "use POST")).await;
    assert_eq!(
        (err.status(), err.code()),
        (Some(405), Some("METHOD_NOT_ALLOWED"))
    );
}

#[tokio::test]
async fn constraint_violation() {
    let err = failure(error(
        409,
        "CONSTRAINT_VIOLATION",
        "UNIQUE constraint failed: t.id",
    ))
    .await;
    assert_eq!(
        err.kind(),
        &ErrorKind::ConstraintViolation {
            constraint: None,
            message: "UNIQUE constraint failed: t.id".into()
        }
    );
    assert_eq!(err.code(), Some("CONSTRAINT_VIOLATION"));
    assert_eq!(err.constraint(), None, "the server did not say");
}

#[tokio::test]
async fn constraint_violation_names_its_kind_when_the_server_does() {
    for (wire, kind) in [
        ("unique", ConstraintKind::Unique),
        ("primary_key", ConstraintKind::PrimaryKey),
        ("foreign_key", ConstraintKind::ForeignKey),
        ("check", ConstraintKind::Check),
        ("not_null", ConstraintKind::NotNull),
        ("deferred", ConstraintKind::Other("deferred".into())),
    ] {
        let err = failure(ResponseTemplate::new(409).set_body_json(json!({"error": {
            "code": "CONSTRAINT_VIOLATION",
            "message": "constraint failed",
            "constraint": wire,
        }})))
        .await;
        assert_eq!(err.constraint(), Some(&kind), "{wire}");
        assert_eq!(
            err.kind(),
            &ErrorKind::ConstraintViolation {
                constraint: Some(kind),
                message: "constraint failed".into()
            }
        );
        assert!(!err.is_retryable());
    }
    let err = failure(ResponseTemplate::new(409).set_body_json(json!({"error": {
        "code": "CONSTRAINT_VIOLATION", "message": "m", "constraint": "foreign_key",
    }})))
    .await;
    assert_eq!(err.to_string(), "foreign key violation: m");
}

#[tokio::test]
async fn the_sandbox_and_the_statement_timeout_are_final_kinds_of_their_own() {
    let err = failure(error(403, "STATEMENT_NOT_ALLOWED", "ATTACH is not allowed")).await;
    assert_eq!(
        err.kind(),
        &ErrorKind::StatementNotAllowed {
            message: "ATTACH is not allowed".into()
        }
    );
    assert_eq!(
        (err.status(), err.code(), err.is_retryable()),
        (Some(403), Some("STATEMENT_NOT_ALLOWED"), false)
    );
    let err = failure(error(422, "STATEMENT_TIMEOUT", "interrupted after 30 s")).await;
    assert_eq!(
        err.kind(),
        &ErrorKind::StatementTimeout {
            message: "interrupted after 30 s".into()
        }
    );
    assert_eq!(
        (
            err.status(),
            err.code(),
            err.is_retryable(),
            err.is_timeout()
        ),
        (Some(422), Some("STATEMENT_TIMEOUT"), false, false)
    );
}

#[tokio::test]
async fn the_servers_other_new_refusals_stay_http_errors() {
    for (status, code, retryable) in [
        (415, "UNSUPPORTED_MEDIA_TYPE", false),
        (403, "ORIGIN_NOT_ALLOWED", false),
        (408, "REQUEST_TIMEOUT", true),
        (431, "HEADERS_TOO_LARGE", false),
    ] {
        let err = failure(error(status, code, "no")).await;
        assert_eq!(
            err.kind(),
            &ErrorKind::Http {
                status,
                code: Some(code.into()),
                message: "no".into()
            }
        );
        assert_eq!(err.is_retryable(), retryable, "{code}");
    }
}

#[tokio::test]
async fn payload_too_large() {
    let err = failure(error(413, "PAYLOAD_TOO_LARGE", "body over 1048576 bytes")).await;
    assert!(matches!(err.kind(), ErrorKind::PayloadTooLarge { .. }));
    assert_eq!(
        (err.status(), err.code()),
        (Some(413), Some("PAYLOAD_TOO_LARGE"))
    );
}

#[tokio::test]
async fn idempotency_key_reused() {
    let err = failure(error(422, "IDEMPOTENCY_KEY_REUSED", "different body")).await;
    assert_eq!(
        (err.status(), err.code(), err.is_retryable()),
        (Some(422), Some("IDEMPOTENCY_KEY_REUSED"), false)
    );
}

#[tokio::test]
async fn rate_limited_carries_the_servers_wait() {
    let err =
        failure(error(429, "RATE_LIMITED", "slow down").insert_header("retry-after", "120")).await;
    assert_eq!(
        err.kind(),
        &ErrorKind::RateLimited {
            retry_after: Some(Duration::from_secs(120)),
            message: "slow down".into()
        }
    );
    assert_eq!(err.retry_after(), Some(Duration::from_secs(120)));
    assert!(err.is_retryable());
}

#[tokio::test]
async fn internal_and_unavailable() {
    let err = failure(error(500, "INTERNAL", "internal error")).await;
    assert_eq!(
        (err.status(), err.code(), err.is_retryable()),
        (Some(500), Some("INTERNAL"), true)
    );
    let err =
        failure(error(503, "UNAVAILABLE", "database is locked").insert_header("retry-after", "1"))
            .await;
    assert_eq!(
        err.kind(),
        &ErrorKind::Unavailable {
            retry_after: Some(Duration::from_secs(1)),
            message: "database is locked".into()
        }
    );
}

#[tokio::test]
async fn outcome_unknown_is_its_own_kind_and_says_the_write_may_have_been_applied() {
    let server = server().await;
    respond_always(
        &server,
        error(503, "OUTCOME_UNKNOWN", "the COMMIT did not answer in time")
            .insert_header("retry-after", "1"),
    )
    .await;
    let client = client_with(&server, quick(3));
    let err = client.execute("UPDATE t SET n = 1").await.unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::OutcomeUnknown {
            retry_after: Some(std::time::Duration::from_secs(1)),
            message: "the COMMIT did not answer in time".into()
        }
    );
    assert_eq!(
        (err.status(), err.code(), err.is_retryable()),
        (Some(503), Some("OUTCOME_UNKNOWN"), true)
    );
    assert!(err.is_sent() && err.is_outcome_unknown(), "{err:?}");
    assert_eq!(err.attempts(), 1, "execute is never retried");
    assert!(err.to_string().contains("outcome unknown"), "{err}");

    // A read is never "outcome unknown", whatever it met.
    let err = client
        .query("SELECT 1")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(!err.is_outcome_unknown(), "{err:?}");
    assert_eq!(err.attempts(), 3, "a read is retried");
}

#[tokio::test]
async fn unavailable_stays_busy_nothing_ran() {
    let err = {
        let server = server().await;
        respond_always(&server, error(503, "UNAVAILABLE", "busy")).await;
        let client = client_with(&server, quick(1));
        client.execute("UPDATE t SET n = 1").await.unwrap_err()
    };
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable { .. }),
        "{err:?}"
    );
    assert!(!err.is_outcome_unknown(), "{err:?}");
}

#[tokio::test]
async fn bookmark_ahead_is_its_own_kind() {
    let err = failure(error(409, "BOOKMARK_AHEAD", "past the primary")).await;
    assert_eq!(
        err.kind(),
        &ErrorKind::BookmarkAhead {
            message: "past the primary".into()
        }
    );
    assert_eq!(
        (err.status(), err.code(), err.is_retryable()),
        (Some(409), Some("BOOKMARK_AHEAD"), false)
    );
}

#[tokio::test]
async fn statuses_without_a_protocol_body() {
    let err = failure(ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>")).await;
    assert_eq!(
        err.kind(),
        &ErrorKind::Http {
            status: 502,
            code: None,
            message: "Bad Gateway".into()
        }
    );
    let err = failure(ResponseTemplate::new(501)).await;
    assert_eq!((err.status(), err.is_retryable()), (Some(501), false));
    let err = failure(ResponseTemplate::new(418).set_body_json(json!({"unexpected": true}))).await;
    assert_eq!(err.status(), Some(418));
}

#[tokio::test]
async fn a_refused_connection_is_a_retryable_connection_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = sqlhttp::Client::builder(format!("http://{addr}"))
        .http_client(plain_http())
        .retry(quick(2))
        .build()
        .unwrap();
    let err = client.ping().await.unwrap_err();
    assert!(err.is_connection() && err.is_retryable(), "{err:?}");
    assert_eq!(err.attempts(), 2);
    assert_eq!(err.status(), None);
    let text = err.to_string();
    assert!(
        text.contains(&format!("http://{addr}")),
        "names the server: {text}"
    );
    assert_eq!(text.matches("2 attempts").count(), 1, "{text}");
}

#[tokio::test]
async fn https_to_a_plain_http_server_is_final_and_says_so() {
    let server = server().await;
    respond_always(&server, ResponseTemplate::new(200)).await;
    let url = server.uri().replacen("http://", "https://", 1);
    let client = sqlhttp::Client::builder(&url)
        .retry(quick(3))
        .build()
        .unwrap();
    let err = client.ping().await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Tls { .. }), "{err:?}");
    assert_eq!(
        err.attempts(),
        1,
        "a handshake that cannot work is not retried"
    );
    assert!(!err.is_sent(), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("speaking HTTPS"), "{text}");
    assert!(text.contains(&url.replacen("https://", "", 1)), "{text}");
}

/// An error body is read to a small cap, never whole: a server that answers an error with
/// megabytes costs the client no more than the cap, and the status still decides.
#[tokio::test]
async fn an_error_body_is_read_to_a_cap() {
    let huge = format!(
        r#"{{"error":{{"code":"UNAVAILABLE","message":"{}"}}}}"#,
        "x".repeat(8 * 1024 * 1024)
    );
    let err =
        failure(ResponseTemplate::new(503).set_body_raw(huge.into_bytes(), "application/json"))
            .await;
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable { message, .. } if message.len() < 64 * 1024),
        "{:?}",
        err.kind().to_string().len()
    );
    assert_eq!(err.status(), Some(503));
}
