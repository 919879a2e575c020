//! Bearer-token authentication for the API, compared in constant time: which [`Credential`] a
//! request presents (a full-access token, a read-only one, or anonymous on an open server).
//!
//! Tokens are kept only as SHA-256 digests, so the comparison takes the same time whatever the
//! length or content of the presented token. Knows headers and digests; never logs a token.

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::error::ServerError;
use crate::http::credentials::{Credential, Identity, Label, Role};
use crate::protocol::error::{ApiError, ErrorCode};

/// The accepted tokens, as digests with the credential each stands for; empty means the API is
/// open.
#[derive(Clone, Default)]
pub(crate) struct Tokens {
    digests: Vec<([u8; 32], Credential)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.digests.len())
            .finish()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Tokens {
    /// Full-access tokens (labelled `token#1`, `token#2`, ... in their order) and read-only ones
    /// (`read#1`, ...). A token in both lists is refused: its role would be ambiguous.
    pub(crate) fn new<'a>(
        full: impl IntoIterator<Item = &'a str>,
        read: impl IntoIterator<Item = &'a str>,
    ) -> Result<Tokens, ServerError> {
        let mut digests: Vec<([u8; 32], Credential)> = full
            .into_iter()
            .enumerate()
            .map(|(index, t)| {
                let digest = digest(t.as_bytes());
                let identity = Identity::of_token_digest(&digest);
                (digest, Credential::full(Label::Token(index + 1), identity))
            })
            .collect();
        for (index, token) in read.into_iter().enumerate() {
            let read = digest(token.as_bytes());
            if digests
                .iter()
                .any(|(d, c)| c.may_write() && equal(d, &read))
            {
                return Err(ServerError::ConflictingTokens {
                    read_index: index + 1,
                });
            }
            let identity = Identity::of_token_digest(&read);
            digests.push((
                read,
                Credential::read_only(Label::Read(index + 1), identity),
            ));
        }
        Ok(Tokens { digests })
    }

    /// Whether no token is configured (anyone may call the API).
    #[cfg(test)]
    pub(crate) fn is_open(&self) -> bool {
        self.digests.is_empty()
    }

    /// The request's credential: anonymous when no token is required, else the one its
    /// `Authorization: Bearer <token>` names; `401 UNAUTHORIZED` when that is missing or wrong.
    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Result<Credential, ApiError> {
        if self.digests.is_empty() {
            return Ok(Credential::anonymous());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| bearer_token(value.as_bytes()));
        let Some(presented) = presented else {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                "this server requires `Authorization: Bearer <token>`",
            ));
        };
        let presented = digest(presented);
        // Look at every accepted token, without short-circuiting.
        let matched = self
            .digests
            .iter()
            .fold(None, |found, (accepted, credential)| {
                let this = equal(accepted, &presented).then_some(*credential);
                found.or(this)
            });
        if let Some(credential) = matched {
            Ok(credential)
        } else {
            Err(ApiError::new(
                ErrorCode::Unauthorized,
                "the bearer token is not valid",
            ))
        }
    }

    /// The credential another sqlhttpd vouches for when it forwards a request (see `peers`):
    /// `identity` with the `role` that server gave it, labelled as this server's own token of
    /// that identity when it has one (for logs), else as a peer's.
    pub(crate) fn vouched(&self, identity: Identity, role: Role) -> Credential {
        let label = match self.digests.iter().find(|(_, c)| c.identity == identity) {
            Some((_, credential)) => credential.label,
            None if self.digests.is_empty() && identity == Identity::ANONYMOUS => Label::Anonymous,
            None => Label::Peer,
        };
        Credential {
            label,
            role,
            identity,
        }
    }
}

fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.strip_prefix(b" ")?.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Constant-time equality of two digests.
fn equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_auth(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn tokens(full: &[&str], read: &[&str]) -> Tokens {
        Tokens::new(full.iter().copied(), read.iter().copied()).unwrap()
    }

    #[test]
    fn open_when_no_tokens() {
        let open = tokens(&[], &[]);
        assert!(open.is_open());
        let credential = open.authorize(&HeaderMap::new()).unwrap();
        assert_eq!(credential, Credential::anonymous());
        assert!(credential.may_write());
    }

    #[test]
    fn each_token_is_its_credential() {
        let tokens = tokens(&["alpha", "beta"], &["gamma"]);
        assert!(!tokens.is_open());
        let alpha = tokens.authorize(&with_auth("Bearer alpha")).unwrap();
        assert_eq!(alpha.label.to_string(), "token#1");
        assert!(alpha.may_write());
        let beta = tokens.authorize(&with_auth("bearer beta")).unwrap();
        assert_eq!(beta.label.to_string(), "token#2");
        let gamma = tokens.authorize(&with_auth("Bearer gamma")).unwrap();
        assert_eq!(gamma.label.to_string(), "read#1");
        assert!(!gamma.may_write());
        assert!(tokens.authorize(&HeaderMap::new()).is_err());
    }

    #[test]
    fn only_read_tokens_still_require_a_token() {
        let tokens = tokens(&[], &["viewer"]);
        assert!(!tokens.is_open());
        assert!(tokens.authorize(&HeaderMap::new()).is_err());
        assert!(
            !tokens
                .authorize(&with_auth("Bearer viewer"))
                .unwrap()
                .may_write()
        );
    }

    #[test]
    fn a_token_cannot_have_two_roles() {
        let err = Tokens::new(["same"], ["other", "same"]).unwrap_err();
        assert!(matches!(
            err,
            ServerError::ConflictingTokens { read_index: 2 }
        ));
        assert!(!err.to_string().contains("same"));
    }

    #[test]
    fn accepts_any_configured_token() {
        let tokens = tokens(&["alpha", "beta"], &[]);
        assert!(tokens.authorize(&with_auth("Bearer alpha")).is_ok());
        assert!(tokens.authorize(&with_auth("bearer beta")).is_ok());
        for bad in [
            "Bearer gamma",
            "Bearer alph",
            "Bearer alphaa",
            "Basic alpha",
            "Bearer",
            "Bearer ",
        ] {
            let err = tokens.authorize(&with_auth(bad)).unwrap_err();
            assert_eq!(err.code, ErrorCode::Unauthorized, "{bad}");
        }
        assert!(tokens.authorize(&HeaderMap::new()).is_err());
    }

    #[test]
    fn a_vouched_credential_is_its_identity_with_this_servers_label() {
        let tokens = tokens(&["alpha"], &["gamma"]);
        let alpha = tokens.authorize(&with_auth("Bearer alpha")).unwrap();
        assert_eq!(tokens.vouched(alpha.identity, Role::ReadWrite), alpha);
        let gamma = tokens.authorize(&with_auth("Bearer gamma")).unwrap();
        assert_eq!(tokens.vouched(gamma.identity, Role::ReadOnly), gamma);
        let stranger = Identity::of_token_digest(&[9; 32]);
        let vouched = tokens.vouched(stranger, Role::ReadOnly);
        assert_eq!(
            (vouched.label, vouched.role, vouched.identity),
            (Label::Peer, Role::ReadOnly, stranger)
        );
        let open = super::Tokens::new([], []).unwrap();
        assert_eq!(
            open.vouched(Identity::ANONYMOUS, Role::ReadWrite),
            Credential::anonymous()
        );
    }

    #[test]
    fn debug_does_not_show_tokens() {
        let shown = format!("{:?}", tokens(&["hunter2"], &["swordfish"]));
        assert!(!shown.contains("hunter2"));
        assert!(!shown.contains("swordfish"));
    }
}
