//! `GET /api/v1/openapi.json`: the protocol's OpenAPI document (`docs/openapi.yaml`), served as
//! the server was built with it. The document is written in YAML's JSON form (ADR 0030), so it is
//! served as it is, after its leading `#` comment lines: no YAML at runtime, nothing to keep in
//! step. No token is needed (`credentials::authenticate` lets it through, as it lets the probes):
//! the document holds the protocol only, nothing of this server's configuration.
//!
//! Knows the route and the file; nothing about SQL, the engine or credentials.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The document's path.
pub(crate) const OPENAPI_PATH: &str = "/api/v1/openapi.json";

/// The document as written: comment lines, then JSON.
const SOURCE: &str = include_str!("../../../../docs/openapi.yaml");

/// The JSON part of the document: everything from its first `{`.
fn document() -> &'static str {
    SOURCE.find('{').map_or(SOURCE, |start| &SOURCE[start..])
}

/// Answers with the document.
pub(crate) async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        document(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_document_is_json_and_only_comments_precede_it() {
        let value: serde_json::Value = serde_json::from_str(document()).unwrap();
        assert_eq!(value["openapi"], "3.1.0");
        let head = &SOURCE[..SOURCE.len() - document().len()];
        assert!(
            head.lines()
                .all(|line| line.is_empty() || line.starts_with('#')),
            "{head}"
        );
    }
}
