//! Admission: what every API request passes before an engine sees it, once, as an axum
//! extractor ([`Admitted`]) whose rejection is the protocol error. In order, from the head: the
//! request's credential (see `credentials`) and what it may do ([`Access`], decided here and
//! nowhere else), a body declared as JSON, its Idempotency-Key (when the server honours keys),
//! and its read position (`Sqlhttp-Bookmark`, `Sqlhttp-Consistency`); then the body, read within
//! its size and time limits (its bytes held against the server's budget until the answer is
//! sent), decoded, and each statement's text passed through the rules both engines share
//! (`engine::sandbox::check_text`).
//!
//! One rule for a credential that may only read, on every route (ADR 0057): its request runs
//! as a read, and whatever would write is refused `403 READ_ONLY` with nothing written
//! ([`refuse_write`] when admission can tell from the body, the engine otherwise); an
//! Idempotency-Key has nothing to apply once for it. A keyed request is named by one hash,
//! [`identity`].
//!
//! Knows HTTP and the protocol; nothing about either engine.

use std::time::Duration;

use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use sha2::{Digest as _, Sha256};
use tracing::Instrument as _;

use crate::budget::Held;
use crate::engine::sandbox::check_text;
use crate::engine::{Access, keyed};
use crate::http::credentials::{self, Credential};
use crate::http::{IDEMPOTENCY_KEY, SQL_PATH, body, read_at};
use crate::protocol::batch::BatchRequest;
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::state::{AppState, KeyGuard, Shared};

/// Longest accepted Idempotency-Key.
const MAX_KEY_LEN: usize = 255;

/// A request body admission decodes and checks.
pub(crate) trait Admissible: Sized {
    /// The most bytes the body may be.
    fn limit(shared: &Shared) -> usize;

    /// Decodes `bytes` for a credential of `access` and checks what it asks for (a request
    /// that asks to write, sent with a credential that may only read, is [`refuse_write`]'s).
    fn admit(bytes: &[u8], shared: &Shared, access: Access) -> Result<Self, ApiError>;

    /// Whether the route reads at a position its headers name (`Sqlhttp-Bookmark`,
    /// `Sqlhttp-Consistency`), and so refuses malformed ones. A route that never reads at one
    /// (a transaction's statement, commit, rollback or outcome, a statement's description)
    /// ignores them as it always did: a commit re-sent after its answer was lost, through a
    /// proxy that doubled a header, still learns its outcome.
    const READS_AT: bool = false;
}

/// An admitted request: who sent it, what it may do, where its reads may run, under which key,
/// and its decoded body.
#[derive(Debug)]
pub(crate) struct Admitted<B> {
    /// The request's credential.
    pub(crate) credential: Credential,
    /// What the credential may do: [`Access::ReadOnly`] for one that may only read.
    pub(crate) access: Access,
    /// Where the request's reads may run (its `Sqlhttp-Bookmark` and `Sqlhttp-Consistency`),
    /// read with the head, before the body, on the routes that read at one
    /// ([`Admissible::READS_AT`]); the default elsewhere.
    pub(crate) at: ReadAt,
    /// The Idempotency-Key and how long its outcome is kept, when the request carries one
    /// and the server honours keys.
    pub(crate) key: Option<(Duration, String)>,
    /// The decoded body.
    pub(crate) body: B,
    /// The body's bytes, whose hash names a keyed request.
    pub(crate) bytes: axum::body::Bytes,
    /// The body's share of the server's budget, to hold until the request is answered.
    pub(crate) held: Held,
}

impl<B: Admissible> FromRequest<AppState> for Admitted<B> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        admit(request, state)
            .instrument(tracing::info_span!("admission"))
            .await
    }
}

/// Admits a request (see [`Admitted`]), under the request's `admission` span.
async fn admit<B: Admissible>(request: Request, state: &AppState) -> Result<Admitted<B>, ApiError> {
    let shared = &state.inner;
    let (parts, request_body) = request.into_parts();
    let credential = credentials::of(&parts.extensions, &parts.headers, state)?;
    let access = if credential.may_write() {
        Access::ReadWrite
    } else {
        Access::ReadOnly
    };
    require_json(&parts.headers)?;
    let key = match shared.idempotency_ttl {
        Some(ttl) => idempotency_key(&parts.headers)?.map(|key| (ttl, key)),
        None => None,
    };
    let at = if B::READS_AT {
        read_at(&parts.headers)?
    } else {
        ReadAt::default()
    };
    let (bytes, held) = body::read_within(
        request_body,
        &parts.headers,
        B::limit(shared),
        &shared.budget,
        shared.body_timeout,
    )
    .await?;
    let body = B::admit(&bytes, shared, access)?;
    Ok(Admitted {
        credential,
        access,
        at,
        key,
        body,
        bytes,
        held,
    })
}

impl Admissible for SqlRequest {
    const READS_AT: bool = true;

    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    fn admit(bytes: &[u8], shared: &Shared, _: Access) -> Result<Self, ApiError> {
        let request = SqlRequest::parse(bytes)?;
        has_text(&request.sql)?;
        check_text(&request.sql, &shared.limits)?;
        Ok(request)
    }
}

impl Admissible for BatchRequest {
    const READS_AT: bool = true;

    fn limit(shared: &Shared) -> usize {
        shared.max_batch_bytes
    }

    fn admit(bytes: &[u8], shared: &Shared, access: Access) -> Result<Self, ApiError> {
        let mut batch = BatchRequest::parse(bytes, shared.limits.max_batch_statements)?;
        if access == Access::ReadOnly {
            // A read credential's batch runs as a read-only one: its reads see one snapshot,
            // and a statement that may write is refused with `403 READ_ONLY` and its index.
            batch.read_only = true;
        }
        for (index, statement) in batch.statements.iter().enumerate() {
            has_text(&statement.sql)
                .and_then(|()| check_text(&statement.sql, &shared.limits))
                .map_err(|e| e.at_statement(index))?;
        }
        Ok(batch)
    }
}

impl<B> Admitted<B> {
    /// Whether the request runs as a read: its credential may only read, or it `asked` to.
    pub(crate) fn reads_only(&self, asked: bool) -> bool {
        self.access == Access::ReadOnly || asked
    }
}

/// A keyed request's identity under its Idempotency-Key, the one way every route names one:
/// its `body`, after the `route`'s path for every route but `/api/v1/sql` (whose identity has
/// been its body's alone since keys began, and stays so for the outcomes already stored), so
/// the same bytes sent to two routes under one key are two requests (`422`), never a replay of
/// each other.
pub(crate) fn identity(route: &str, body: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    if route != SQL_PATH {
        hash.update(route);
        hash.update(b"\n");
    }
    hash.update(body);
    hash.finalize().into()
}

/// The one answer to a request that asks to write (`what`, as the client would name it), sent
/// with a credential that may only read: `403 READ_ONLY`, nothing run.
pub(crate) fn refuse_write(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::ReadOnly,
        format!("this credential may only read: {what}; nothing was written"),
    )
}

/// `400 SQL_ERROR` for statement text that is empty or only whitespace, refused before anything
/// else about the request is looked at (a transaction's token, say), as the OpenAPI document
/// says (`minLength: 1`, `pattern: \\S`, whose `\\s` this is: Unicode's white space without NEL,
/// with the byte-order mark). Either engine would refuse such text too (no statement, or a
/// syntax error); text of only comments is still the engine's to refuse.
pub(crate) fn has_text(sql: &str) -> Result<(), ApiError> {
    let blank = |c: char| (c.is_whitespace() && c != '\u{85}') || c == '\u{feff}';
    if sql.chars().all(blank) {
        return Err(ApiError::sql("the SQL text contains no statement"));
    }
    Ok(())
}

/// Marks `key` as running until the returned claim drops, or answers `409
/// IDEMPOTENCY_KEY_IN_USE` when a request with it is running already.
pub(crate) fn claim(state: &AppState, key: &str) -> Result<KeyGuard, ApiError> {
    state.inner.claim(key).ok_or_else(keyed::in_use)
}

/// `415 UNSUPPORTED_MEDIA_TYPE` unless the body is declared as JSON. Browsers can send
/// `text/plain` across origins without asking first; they cannot send `application/json`.
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(str::trim);
    match declared {
        Some(media) if media.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "the body must be sent with `Content-Type: application/json`",
        )),
    }
}

/// The request's Idempotency-Key: 1 to 255 visible ASCII characters, at most one header.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::bad_request(format!(
            "Idempotency-Key must be one header of 1 to {MAX_KEY_LEN} visible ASCII characters"
        ))
    };
    let bytes = value.as_bytes();
    if values.next().is_some()
        || bytes.is_empty()
        || bytes.len() > MAX_KEY_LEN
        || !bytes.iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Err(invalid());
    }
    // Visible ASCII is valid UTF-8.
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn only_json_bodies_are_accepted() {
        let with = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(
                    axum::http::header::CONTENT_TYPE,
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            require_json(&headers).map_err(|e| e.code)
        };
        assert_eq!(with(Some("application/json")), Ok(()));
        assert_eq!(with(Some("Application/JSON; charset=utf-8")), Ok(()));
        for refused in [
            None,
            Some("text/plain"),
            Some("application/jsonx"),
            Some(""),
        ] {
            assert_eq!(
                with(refused),
                Err(ErrorCode::UnsupportedMediaType),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn blank_text_is_no_statement() {
        for blank in [
            "",
            " ",
            "\t\n\r\u{b}\u{c}",
            "\u{a0}\u{3000}\u{feff}\u{2028}",
        ] {
            let refused = has_text(blank).unwrap_err();
            assert_eq!(refused.code, ErrorCode::SqlError, "{blank:?}");
        }
        for text in ["SELECT 1", " x ", "\u{85}", "-- only a comment"] {
            assert!(has_text(text).is_ok(), "{text:?}");
        }
    }

    #[test]
    fn idempotency_key_syntax() {
        let with = |values: &[&[u8]]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(value).unwrap());
            }
            idempotency_key(&headers)
        };
        assert_eq!(with(&[]).unwrap(), None);
        assert_eq!(with(&[b"abc-123"]).unwrap().as_deref(), Some("abc-123"));
        assert!(with(&[&[b'k'; 255]]).unwrap().is_some());
        assert!(with(&[&[b'k'; 256]]).is_err());
        assert!(with(&[b""]).is_err());
        assert!(with(&[b"has space"]).is_err());
        assert!(with(&[b"tab\there"]).is_err());
        assert!(with(&[b"caf\xc3\xa9"]).is_err());
        assert!(with(&[b"a", b"b"]).is_err());
    }
}
