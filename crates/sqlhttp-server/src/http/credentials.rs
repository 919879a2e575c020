//! Who is calling: [`Credential`] (a [`Label`] safe to log and a [`Role`]), and the
//! [`authenticate`] layer every `/api/` request passes first: it finds the request's credential
//! (`401` when a token is required and missing or wrong), spends one token of its rate-limit
//! bucket (`429` past it), and puts the credential in the request's extensions, where any
//! endpoint consults it (`Credential::may_write`). The label is copied into the response's
//! extensions for the request log.
//!
//! Knows headers, extensions and the client's address; never a token's text, nothing about SQL
//! or the engine.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::rate_limit::Key;
use crate::state::AppState;

/// Paths under this prefix are the API: authenticated and rate-limited. Probes, metrics and the
/// OpenAPI document are not.
const API_PREFIX: &str = "/api/";

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// Reads and writes (a `--token`, or anyone on an open server).
    ReadWrite,
    /// Reads only (a `--read-token`): a statement that may write is refused with `403 READ_ONLY`.
    ReadOnly,
}

/// The name a credential goes by in logs and metrics: never the token itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Label {
    /// No token is configured: the API is open.
    Anonymous,
    /// The n-th full-access token (from 1), in configuration order.
    Token(usize),
    /// The n-th read-only token (from 1), in configuration order.
    Read(usize),
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Anonymous => f.write_str("anonymous"),
            Label::Token(n) => write!(f, "token#{n}"),
            Label::Read(n) => write!(f, "read#{n}"),
        }
    }
}

/// The authenticated caller of one request, in its extensions for every `/api/` endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Credential {
    pub(crate) label: Label,
    pub(crate) role: Role,
}

impl Credential {
    pub(crate) fn anonymous() -> Credential {
        Credential {
            label: Label::Anonymous,
            role: Role::ReadWrite,
        }
    }

    pub(crate) fn full(label: Label) -> Credential {
        Credential {
            label,
            role: Role::ReadWrite,
        }
    }

    pub(crate) fn read_only(label: Label) -> Credential {
        Credential {
            label,
            role: Role::ReadOnly,
        }
    }

    /// Whether statements that write may run for this credential.
    pub(crate) fn may_write(&self) -> bool {
        self.role == Role::ReadWrite
    }
}

/// The client's IP address, when the server put it in the request (the accept loop does).
fn client_ip(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip())
}

/// Authenticates and rate-limits every `/api/` request; other paths pass untouched.
///
/// A named token's bucket is its own wherever it calls from; anonymous requests, and requests
/// whose token is refused (so guessing tokens is throttled too), share their address's bucket.
pub(crate) async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    // The protocol's document is public: it holds nothing of this server's.
    if !path.starts_with(API_PREFIX) || path == super::openapi::OPENAPI_PATH {
        return next.run(request).await;
    }
    let shared = &state.inner;
    let credential = shared.tokens.authorize(request.headers());
    if let Some(limiter) = &shared.rate_limiter {
        let key = match &credential {
            Ok(Credential {
                label: label @ (Label::Token(_) | Label::Read(_)),
                ..
            }) => Key::Credential(*label),
            _ => Key::Address(client_ip(&request)),
        };
        if let Err(refusal) = limiter.check(&key) {
            let mut response = refusal.into_response();
            if let Ok(credential) = &credential {
                response.extensions_mut().insert(credential.label);
            }
            return response;
        }
    }
    match credential {
        Ok(credential) => {
            request.extensions_mut().insert(credential);
            let mut response = next.run(request).await;
            response.extensions_mut().insert(credential.label);
            response
        }
        Err(err) => err.into_response(),
    }
}

/// The request's credential, as [`authenticate`] found it; authenticates again if the request
/// did not pass through it.
pub(crate) fn of(
    extensions: &axum::http::Extensions,
    headers: &axum::http::HeaderMap,
    state: &AppState,
) -> Result<Credential, crate::protocol::error::ApiError> {
    match extensions.get::<Credential>() {
        Some(credential) => Ok(*credential),
        None => state.inner.tokens.authorize(headers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_never_carry_a_token() {
        assert_eq!(Label::Anonymous.to_string(), "anonymous");
        assert_eq!(Label::Token(1).to_string(), "token#1");
        assert_eq!(Label::Read(2).to_string(), "read#2");
    }

    #[test]
    fn roles() {
        assert!(Credential::anonymous().may_write());
        assert!(Credential::full(Label::Token(1)).may_write());
        assert!(!Credential::read_only(Label::Read(1)).may_write());
    }
}
