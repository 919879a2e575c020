//! `GET /api/v1/openapi.json`: the protocol's OpenAPI document (this crate's `openapi.yaml`, the
//! one copy: `docs/openapi.yaml` is a link to it, so the published crate builds from its own
//! files; ADR 0049), served as the server was built with it, for the engine it runs on. The
//! document is written in YAML's JSON form (ADR 0030); a schema whose accepted values differ
//! between the engines says so in an `x-sqlite` or `x-postgresql` member, an object of keywords
//! that replace the schema's own on that engine (SQLite's `isolation` is `serializable` only,
//! PostgreSQL refuses `foreign_keys: checked_at_commit`), so each server documents exactly what
//! it accepts (ADR 0044). The served document is the file with that engine's members applied and
//! both engines' removed, built once. No token is needed (`credentials::authenticate` lets it
//! through, as it lets the probes): the document holds the protocol only, nothing of this
//! server's configuration.
//!
//! Knows the route, the file and which engine serves; nothing about SQL or credentials.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::engine::Backend;
use crate::state::AppState;

/// The document's path.
pub(crate) const OPENAPI_PATH: &str = sqlhttp_protocol::path::OPENAPI;

/// The document as written: comment lines, then JSON. Inside the crate, so its package compiles.
const SOURCE: &str = include_str!("../../openapi.yaml");

/// The members that say what one engine accepts, by engine.
const ENGINE_MEMBERS: [&str; 2] = ["x-sqlite", "x-postgresql"];

/// The JSON part of the document: everything from its first `{`.
fn source_json() -> &'static str {
    SOURCE.find('{').map_or(SOURCE, |start| &SOURCE[start..])
}

/// The document for the engine whose member is `engine` (one of [`ENGINE_MEMBERS`]).
fn document_for(engine: &str) -> String {
    let mut value: Value = match serde_json::from_str(source_json()) {
        Ok(value) => value,
        // Held to be JSON by the test below; were it not, serve it as written.
        Err(_) => return source_json().to_owned(),
    };
    apply(&mut value, engine);
    value.to_string()
}

/// Applies `engine`'s members throughout `value` and removes every engine's.
fn apply(value: &mut Value, engine: &str) {
    match value {
        Value::Object(members) => {
            let own = members.get(engine).cloned();
            for name in ENGINE_MEMBERS {
                members.remove(name);
            }
            if let Some(Value::Object(overrides)) = own {
                members.extend(overrides);
            }
            members
                .values_mut()
                .for_each(|member| apply(member, engine));
        }
        Value::Array(items) => items.iter_mut().for_each(|item| apply(item, engine)),
        _ => {}
    }
}

/// The served document for `backend`'s engine, built once per engine.
fn document(backend: &Backend) -> &'static str {
    static SQLITE: OnceLock<String> = OnceLock::new();
    #[cfg(feature = "postgres")]
    static POSTGRESQL: OnceLock<String> = OnceLock::new();
    match backend {
        Backend::Sqlite(_) => SQLITE.get_or_init(|| document_for(ENGINE_MEMBERS[0])),
        #[cfg(feature = "postgres")]
        Backend::Postgres(_) => POSTGRESQL.get_or_init(|| document_for(ENGINE_MEMBERS[1])),
    }
}

/// Answers with the document.
pub(crate) async fn openapi(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        document(&state.inner.engine),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_is_json_and_only_comments_precede_it() {
        let value: serde_json::Value = serde_json::from_str(source_json()).unwrap();
        assert_eq!(value["openapi"], "3.1.0");
        let head = &SOURCE[..SOURCE.len() - source_json().len()];
        assert!(
            head.lines()
                .all(|line| line.is_empty() || line.starts_with('#')),
            "{head}"
        );
    }

    #[test]
    fn each_engine_gets_its_own_members_and_neither_keeps_any() {
        for engine in ENGINE_MEMBERS {
            let text = document_for(engine);
            for name in ENGINE_MEMBERS {
                assert!(!text.contains(&format!("\"{name}\"")), "{engine}: {name}");
            }
        }
        let mut value = serde_json::json!({
            "a": {"enum": [1, 2, 3], "description": "d", "x-sqlite": {"enum": [1]}},
            "b": [{"x-postgresql": {"const": 2}}]
        });
        apply(&mut value, "x-sqlite");
        assert_eq!(
            value,
            serde_json::json!({"a": {"enum": [1], "description": "d"}, "b": [{}]})
        );
    }
}
