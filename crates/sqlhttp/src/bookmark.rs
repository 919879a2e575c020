//! Read-your-writes across read replicas: the server's [`Bookmark`] (a position in the database's
//! history), the [`Consistency`] a read asks for, and the session a client and its clones share,
//! which keeps the greatest bookmark any response carried and sends it on every request.
//!
//! The bookmark's type and text, and the headers' names, are the protocol crate's (ADR 0048); this
//! module knows the rule "keep the greatest"; it does not know when
//! a request is sent or retried (the transport reads the session before each attempt and merges each
//! success's bookmark), nor what the server does with a bookmark (the protocol says: a replica
//! serves a read only once it has replayed that far, else the primary does).

use std::sync::Mutex;

use http::{HeaderMap, HeaderValue};
use sqlhttp_protocol::header;

/// A position in the database's history, as the server names it in the `Sqlhttp-Bookmark` header:
/// what an answer is consistent with (a write: at or after its commit; a read: at or after everything
/// it saw). The protocol's own type (`sqlhttp_protocol::Bookmark`, ADR 0048), re-exported.
///
/// Opaque but ordered: a greater bookmark is a later position. A [`Client`](crate::Client) keeps the
/// greatest it has seen and sends it on every request, so it reads its own writes even from a read
/// replica; carry one to another process as its string (a cookie, a job's payload) and hand it to
/// [`ClientBuilder::bookmark`](crate::ClientBuilder::bookmark),
/// [`Client::observe_bookmark`](crate::Client::observe_bookmark) or a call's
/// [`bookmark`](crate::Query::bookmark) there. Its text is 16 hexadecimal digits (written in lower
/// case; upper case parses too), and it serializes (serde) as that string.
///
/// ```
/// use sqlhttp::Bookmark;
///
/// let earlier: Bookmark = "000000000169a3f8".parse()?;
/// let later: Bookmark = "00000000016a0010".parse()?;
/// assert!(earlier < later);
/// assert_eq!(later.to_string(), "00000000016a0010");
/// assert!("not a bookmark".parse::<Bookmark>().is_err());
/// # Ok::<(), sqlhttp::ParseBookmarkError>(())
/// ```
pub use sqlhttp_protocol::Bookmark;

/// Why a text is not a [`Bookmark`]: it is not exactly 16 hexadecimal digits.
pub use sqlhttp_protocol::ParseBookmarkError;

/// The bookmark as a request header's value.
pub(crate) fn header_value(bookmark: Bookmark) -> HeaderValue {
    HeaderValue::try_from(bookmark.to_string()).expect("hex digits are a valid header value")
}

/// Which server may answer a read, and how fresh it must be: set per call with
/// [`Query::consistency`](crate::Query::consistency) (and on the other read builders).
///
/// Writes and interactive transactions always go to the primary; this chooses for reads only.
///
/// # Starting afresh
///
/// A bookmark belongs to one primary's log. After a **failover** (a new primary whose log may be
/// behind the old one's), or when a client is pointed at **another cluster**, the session's
/// bookmark can be past anything the new primary has written: call
/// [`Client::reset_bookmark`](crate::Client::reset_bookmark) then, and drop any bookmark handed
/// over from before (a cookie, a job's payload). A server that gets such a bookmark answers
/// `409 BOOKMARK_AHEAD` ([`ErrorKind::BookmarkAhead`](crate::ErrorKind::BookmarkAhead)) and runs
/// nothing; the SDK then drops the session's bookmark itself and sends the call again without it
/// (an `execute` returns the error instead, and its next call goes out without it). Reads right
/// after a reset may miss writes made before it on the old primary: that is the price of the
/// failover, not of the reset.
///
/// An answer whose body streamed carries its bookmark at the end of the body instead of in its
/// `Sqlhttp-Bookmark` header (a write that committed after its headers were sent): the SDK takes
/// it from there, when the body has been read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Consistency {
    /// The session's guarantee (the default): the request carries the greatest bookmark the client
    /// has seen (or the call's own, if greater), so the answer reflects every write the client made
    /// or saw, and never one older than a read before it. A replica that has not replayed that far
    /// within the server's `--replica-wait` hands the read to the primary.
    #[default]
    Session,
    /// Any healthy replica, at once: no bookmark is sent (neither the session's nor the call's), so
    /// the answer may miss the client's latest writes. The bookmark of the answer is still merged
    /// into the session, so a later `Session` read never goes back before it.
    AnyReplica,
    /// The primary serves the read (`Sqlhttp-Consistency: primary`): the latest committed state,
    /// at the primary's cost. The session's bookmark is sent as for `Session`.
    Primary,
}

/// The greatest bookmark a client and its clones have seen; empty until a response carries one
/// (or the builder gave one).
#[derive(Debug, Default)]
pub(crate) struct Session {
    greatest: Mutex<Option<Bookmark>>,
}

impl Session {
    pub(crate) fn new(start: Option<Bookmark>) -> Self {
        Self {
            greatest: Mutex::new(start),
        }
    }

    /// The greatest bookmark seen so far.
    pub(crate) fn get(&self) -> Option<Bookmark> {
        *self
            .greatest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `bookmark` if it is greater than any seen before; an older one changes nothing.
    pub(crate) fn observe(&self, bookmark: Bookmark) {
        let mut greatest = self
            .greatest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if greatest.is_none_or(|known| known < bookmark) {
            *greatest = Some(bookmark);
        }
    }

    /// Forgets the bookmark: the next request carries none (unless its call has one of its own).
    pub(crate) fn reset(&self) {
        *self
            .greatest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Forgets the bookmark after a server refused `refused` as ahead of its primary, unless the
    /// session has since gone back below it (another call reset it and saw a valid one since).
    pub(crate) fn drop_refused(&self, refused: Bookmark) {
        let mut greatest = self
            .greatest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if greatest.is_some_and(|known| known >= refused) {
            *greatest = None;
        }
    }

    /// The bookmark an attempt sent now carries: the greatest of the session's and the call's own,
    /// none at all under [`Consistency::AnyReplica`].
    pub(crate) fn for_request(
        &self,
        consistency: Consistency,
        call: Option<Bookmark>,
    ) -> Option<Bookmark> {
        match consistency {
            Consistency::AnyReplica => None,
            Consistency::Session | Consistency::Primary => self.get().max(call),
        }
    }
}

/// The bookmark a response carries, if it carries a valid one. A malformed one (a server's bug, a
/// proxy's rewrite) is logged and ignored: it must not fail an answer that is otherwise good, and
/// it cannot be compared with the others.
pub(crate) fn from_headers(headers: &HeaderMap) -> Option<Bookmark> {
    let value = headers.get(header::BOOKMARK)?;
    let parsed = value
        .to_str()
        .ok()
        .and_then(|text| text.parse::<Bookmark>().ok());
    if parsed.is_none() {
        tracing::warn!(
            value = %String::from_utf8_lossy(value.as_bytes()),
            "the server sent a malformed Sqlhttp-Bookmark header; ignored"
        );
    }
    parsed
}

/// The bookmark a success body names at its end (`"bookmark": "..."`, after `last_insert_id`: an
/// answer that committed after its headers were sent), given the member's raw JSON value. Taken
/// as the header's is; an ill-formed one (not a string of 16 hexadecimal digits) is logged and
/// ignored, never an error.
pub(crate) fn from_body_member(raw: &str) -> Option<Bookmark> {
    let parsed = serde_json::from_str::<&str>(raw)
        .ok()
        .and_then(|text| text.parse::<Bookmark>().ok());
    if parsed.is_none() {
        tracing::warn!(
            length = raw.len(),
            "the server ended a body with a malformed bookmark; ignored"
        );
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_keeps_the_greatest() {
        let b = Bookmark::from_position;
        let session = Session::new(None);
        assert_eq!(session.get(), None);
        for n in [5, 3, 9, 1, 9, 7] {
            session.observe(b(n));
        }
        assert_eq!(session.get(), Some(b(9)));
        assert_eq!(
            session.for_request(Consistency::Session, Some(b(4))),
            Some(b(9))
        );
        assert_eq!(
            session.for_request(Consistency::Primary, Some(b(12))),
            Some(b(12))
        );
        assert_eq!(
            session.for_request(Consistency::AnyReplica, Some(b(12))),
            None
        );
        assert_eq!(
            Session::new(None).for_request(Consistency::Session, None),
            None
        );
    }

    #[test]
    fn a_refused_bookmark_is_dropped_unless_the_session_went_below_it() {
        let b = Bookmark::from_position;
        let session = Session::new(Some(b(9)));
        session.drop_refused(b(9));
        assert_eq!(session.get(), None);
        // Reset by another call, then raised to a valid position: a late refusal of the old
        // bookmark keeps it.
        session.observe(b(3));
        session.drop_refused(b(9));
        assert_eq!(session.get(), Some(b(3)));
        // Raised past the refused one: dropped too (it is further ahead still).
        session.observe(b(12));
        session.drop_refused(b(9));
        assert_eq!(session.get(), None);
        session.observe(b(4));
        session.reset();
        assert_eq!(session.get(), None);
        assert_eq!(session.for_request(Consistency::Session, None), None);
    }

    #[test]
    fn a_body_s_bookmark_member_is_taken_when_well_formed() {
        assert_eq!(
            from_body_member("\"00000000016b3a28\""),
            Some(Bookmark::from_position(0x16b_3a28))
        );
        for bad in [
            "null",
            "42",
            "\"16b3a28\"",
            "\"0/16B3A28\"",
            "[\"00000000016b3a28\"]",
            "{}",
            "\"00000000016b3a28 \"",
        ] {
            assert_eq!(from_body_member(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_malformed_header_is_none() {
        let mut headers = HeaderMap::new();
        assert_eq!(from_headers(&headers), None);
        headers.insert(header::BOOKMARK, HeaderValue::from_static("0/16B3748"));
        assert_eq!(from_headers(&headers), None);
        headers.insert(
            header::BOOKMARK,
            HeaderValue::from_static("00000000016b3748"),
        );
        assert_eq!(
            from_headers(&headers),
            Some(Bookmark::from_position(0x16b_3748))
        );
    }
}
