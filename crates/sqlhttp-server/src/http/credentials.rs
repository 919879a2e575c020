//! Who is calling: [`Credential`] (a [`Label`] safe to log and a [`Role`]), and
//! [`authenticate`], which every `/api/` request passes first (in the `gate` layer): it finds
//! the request's credential (`401` when a token is required and missing or wrong; a request
//! another sqlhttpd forwarded is the credential its MAC vouches for, see `peers`), spends one
//! token of its rate-limit bucket (`429` past it), and puts the credential in the request's
//! extensions, where any endpoint consults it (`Credential::may_write`). The label is copied
//! into the response's extensions for the request log.
//!
//! Knows headers, extensions and the client's address; never a token's text, nothing about SQL
//! or the engine.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request};
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
    /// A token this server does not have, vouched for by another sqlhttpd that forwarded the
    /// request (see `peers`).
    Peer,
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Anonymous => f.write_str("anonymous"),
            Label::Token(n) => write!(f, "token#{n}"),
            Label::Read(n) => write!(f, "read#{n}"),
            Label::Peer => f.write_str("peer"),
        }
    }
}

/// Who a credential is, in a way that does not move: derived from the token itself (a digest
/// of its digest, under a name of its own), so it is the same after a restart, after other
/// tokens are added or revoked, and on every server that accepts the token. What the server
/// holds for a caller across requests (its interactive transactions, their commit records)
/// belongs to this, never to the [`Label`], which is a position in the configuration and moves
/// when an earlier token is revoked. Not the token: nothing of it can be turned back into one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Identity([u8; 16]);

impl Identity {
    /// The identity of every caller of an open server.
    pub(crate) const ANONYMOUS: Identity = Identity(*b"sqlhttp-anonymus");

    /// The identity of the token whose SHA-256 digest is `digest`.
    pub(crate) fn of_token_digest(digest: &[u8; 32]) -> Identity {
        use sha2::{Digest as _, Sha256};
        let derived: [u8; 32] = Sha256::new()
            .chain_update(b"sqlhttp credential identity\n")
            .chain_update(digest)
            .finalize()
            .into();
        let mut identity = [0; 16];
        identity.copy_from_slice(&derived[..16]);
        Identity(identity)
    }

    /// The identity from its text ([`fmt::Display`]: 32 lower-case hex digits).
    pub(crate) fn parse(text: &str) -> Option<Identity> {
        if text.len() != 32 {
            return None;
        }
        let mut identity = [0; 16];
        for (byte, pair) in identity.iter_mut().zip(text.as_bytes().chunks(2)) {
            let pair = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Identity(identity))
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Identity(..)")
    }
}

/// The authenticated caller of one request, in its extensions for every `/api/` endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Credential {
    /// For logs and metrics.
    pub(crate) label: Label,
    pub(crate) role: Role,
    /// Whose state it is (see [`Identity`]).
    pub(crate) identity: Identity,
}

impl Credential {
    pub(crate) fn anonymous() -> Credential {
        Credential {
            label: Label::Anonymous,
            role: Role::ReadWrite,
            identity: Identity::ANONYMOUS,
        }
    }

    pub(crate) fn full(label: Label, identity: Identity) -> Credential {
        Credential {
            label,
            role: Role::ReadWrite,
            identity,
        }
    }

    pub(crate) fn read_only(label: Label, identity: Identity) -> Credential {
        Credential {
            label,
            role: Role::ReadOnly,
            identity,
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

/// Authenticates and rate-limits every `/api/` request, then has `then` serve it with its
/// [`Credential`] in its extensions; other paths go to `then` untouched.
///
/// A named token's bucket is its own wherever it calls from; anonymous requests, and requests
/// whose token is refused (so guessing tokens is throttled too), share their address's bucket.
pub(crate) async fn authenticate<Then, Ran>(
    state: &AppState,
    mut request: Request,
    then: Then,
) -> Response
where
    Then: FnOnce(Request) -> Ran,
    Ran: Future<Output = Response>,
{
    let path = request.uri().path();
    // The protocol's document is public: it holds nothing of this server's.
    if !path.starts_with(API_PREFIX) || path == super::openapi::OPENAPI_PATH {
        return then(request).await;
    }
    // Another sqlhttpd forwarded it (this one holds the transaction it names): no bearer
    // token, the peer's MAC vouches for the credential. Not rate-limited again (the peer that
    // took it from the client counted it); a refused one is, as a refused token is.
    if super::peers::is_forwarded(request.headers()) {
        let address = Key::Address(client_ip(&request));
        return match super::peers::serve(state, request, then).await {
            Ok(response) => response,
            Err(refused) => match state.inner.rate_limiter.as_ref().map(|l| l.check(&address)) {
                Some(Err(throttled)) => throttled.into_response(),
                _ => refused,
            },
        };
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
            let mut response = then(request).await;
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
        let identity = Identity::of_token_digest(&[7; 32]);
        assert!(Credential::anonymous().may_write());
        assert!(Credential::full(Label::Token(1), identity).may_write());
        assert!(!Credential::read_only(Label::Read(1), identity).may_write());
    }

    #[test]
    fn an_identity_depends_on_the_token_alone_and_reads_back() {
        let a = Identity::of_token_digest(&[1; 32]);
        assert_eq!(a, Identity::of_token_digest(&[1; 32]));
        assert_ne!(a, Identity::of_token_digest(&[2; 32]));
        assert_ne!(a, Identity::ANONYMOUS);
        let text = a.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(Identity::parse(&text), Some(a));
        assert_eq!(Identity::parse("zz"), None);
        assert_eq!(format!("{a:?}"), "Identity(..)");
    }
}
