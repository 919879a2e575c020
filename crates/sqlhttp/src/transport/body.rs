//! The success body of one attempt and what a call does with it: [`Body`] yields a response's
//! pieces as they arrive (or a whole body, from a simulated server or a scripted test), and
//! [`Receive`] is the seam through which the retry loop hands those pieces to the call's receiver
//! until it can serve the caller. A body keeps the [`Bookmark`] its response's head carried; a
//! receiver gives the one a body names at its end.
//!
//! It knows nothing of retries, timeouts or the request (the loop and the exchange do), nor of what
//! the pieces mean (the receivers in `cursor` decode them).

#[cfg(test)]
use std::time::Duration;

use bytes::Bytes;

use crate::bookmark::{self, Bookmark};
use crate::error::ErrorKind;
use crate::response::Failure;

/// A success response's body, read piece by piece as it arrives, and the bookmark of its head.
pub(crate) struct Body {
    inner: BodyInner,
    bookmark: Option<Bookmark>,
}

enum BodyInner {
    /// A body already whole (a simulated server, a scripted test).
    Whole(Option<Bytes>),
    /// The body of an HTTP response, still arriving.
    Http(reqwest::Response),
    /// Pieces that arrive each after its pause (tests of time on a paused clock).
    #[cfg(test)]
    Scripted(std::collections::VecDeque<(Duration, Bytes)>),
}

impl From<Bytes> for Body {
    fn from(bytes: Bytes) -> Self {
        Body {
            inner: BodyInner::Whole(Some(bytes)),
            bookmark: None,
        }
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body").finish_non_exhaustive()
    }
}

impl Body {
    /// The body of a success response, still arriving.
    pub(super) fn http(response: reqwest::Response) -> Body {
        Body {
            bookmark: bookmark::from_headers(response.headers()),
            inner: BodyInner::Http(response),
        }
    }

    /// The body with the bookmark its response's head carried (a simulated server's).
    #[cfg(feature = "test-util")]
    pub(crate) fn with_bookmark(mut self, bookmark: Option<Bookmark>) -> Body {
        self.bookmark = bookmark;
        self
    }

    /// The position the answer is consistent with (`Sqlhttp-Bookmark`), when the server named a
    /// valid one.
    pub(crate) fn bookmark(&self) -> Option<Bookmark> {
        self.bookmark
    }

    /// Whether the server answered with a stored outcome (`Idempotent-Replayed: true`): the
    /// request's key had been applied before, and nothing ran this time.
    pub(crate) fn replayed(&self) -> bool {
        match &self.inner {
            BodyInner::Http(response) => response
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true")),
            _ => false,
        }
    }

    /// The value of the response head's header `name`, when it is text (a simulated or scripted
    /// body has none).
    /// A name made once, not parsed from text at each lookup.
    fn header(&self, name: &http::HeaderName) -> Option<&str> {
        match &self.inner {
            BodyInner::Http(response) => response.headers().get(name)?.to_str().ok(),
            _ => None,
        }
    }

    /// The engine that answered (`sqlhttp-engine`: `sqlite`, `postgresql`), when the server said.
    pub(crate) fn engine(&self) -> Option<&str> {
        const ENGINE: http::HeaderName =
            http::HeaderName::from_static(sqlhttp_protocol::header::ENGINE);
        self.header(&ENGINE)
    }

    /// The server's id for the request (`X-Request-Id`), when it gave one.
    pub(crate) fn request_id(&self) -> Option<&str> {
        const REQUEST_ID: http::HeaderName =
            http::HeaderName::from_static(sqlhttp_protocol::header::REQUEST_ID);
        self.header(&REQUEST_ID)
    }

    /// A body whose pieces arrive each after its pause.
    #[cfg(test)]
    pub(crate) fn scripted(pieces: impl IntoIterator<Item = (Duration, Bytes)>) -> Body {
        Body {
            inner: BodyInner::Scripted(pieces.into_iter().collect()),
            bookmark: None,
        }
    }

    /// The next piece, or `None` at the body's clean end. A body cut short (the connection lost,
    /// a chunked body without its end) is a connection failure.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, Failure> {
        match &mut self.inner {
            BodyInner::Whole(bytes) => Ok(bytes.take()),
            #[cfg(test)]
            BodyInner::Scripted(pieces) => match pieces.pop_front() {
                Some((pause, piece)) => {
                    tokio::time::sleep(pause).await;
                    Ok(Some(piece))
                }
                None => Ok(None),
            },
            BodyInner::Http(response) => response.chunk().await.map_err(|err| {
                let err = err.without_url();
                Failure {
                    kind: ErrorKind::Connection {
                        message: format!("response body ended early: {err}"),
                    },
                    sent: true,
                    source: Some(Box::new(err)),
                    statement: None,
                    request_id: None,
                }
            }),
        }
    }
}

/// What a call does with the body while it may still be retried: it takes the pieces until it has
/// something to hand to the caller (the whole result, or a stream's first row). Until then a
/// failure is retried as any other; after it, never (the caller may have seen rows).
// A `Failure` travels once per attempt, beside an HTTP exchange: returning it by value costs nothing
// that matters.
#[allow(clippy::result_large_err)]
pub(crate) trait Receive: Send {
    /// Forgets what an earlier attempt delivered.
    fn reset(&mut self);
    /// Takes the next piece (`None`: the body ended). `Ok(true)` once the caller can be served.
    fn take(&mut self, piece: Option<&[u8]>) -> Result<bool, Failure>;
    /// The bookmark the body named at its end (`"bookmark"` after `last_insert_id`), once read:
    /// merged into the session as the head's is.
    fn bookmark(&self) -> Option<Bookmark> {
        None
    }
}
