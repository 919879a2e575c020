//! Bearer-token authentication for the SQL endpoint, compared in constant time.
//!
//! Tokens are kept only as SHA-256 digests, so the comparison takes the same time whatever the
//! length or content of the presented token. Knows headers and digests; never logs a token.

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::api_error::{ApiError, ErrorCode};

/// The accepted tokens, as digests; empty means the endpoint is open.
#[derive(Clone, Default)]
pub(crate) struct Tokens {
    digests: Vec<[u8; 32]>,
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
    pub(crate) fn new<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Tokens {
        Tokens {
            digests: tokens.into_iter().map(|t| digest(t.as_bytes())).collect(),
        }
    }

    /// `Ok` when no token is required or the request carries `Authorization: Bearer <token>`
    /// with an accepted token; otherwise `401 UNAUTHORIZED`.
    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.digests.is_empty() {
            return Ok(());
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
            .fold(false, |found, accepted| found | equal(accepted, &presented));
        if matched {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::Unauthorized,
                "the bearer token is not valid",
            ))
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

    #[test]
    fn open_when_no_tokens() {
        assert!(Tokens::new([]).authorize(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn accepts_any_configured_token() {
        let tokens = Tokens::new(["alpha", "beta"]);
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
    fn debug_does_not_show_tokens() {
        let shown = format!("{:?}", Tokens::new(["hunter2"]));
        assert!(!shown.contains("hunter2"));
    }
}
