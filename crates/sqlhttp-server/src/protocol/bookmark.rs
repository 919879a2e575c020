//! Bookmarks: the database position an answer is consistent with, in the `Sqlhttp-Bookmark`
//! header both ways (see `docs/protocol.md`, "Read replicas and bookmarks", and ADR 0039). A
//! bookmark is exactly 16 hexadecimal digits, lower case when the server writes it: a
//! PostgreSQL write-ahead-log position as one 64-bit number, so bookmarks order as plain
//! strings do. Clients treat them as opaque and keep the greatest.
//!
//! Also [`ReadAt`], what a request asks of where its read runs (`Sqlhttp-Consistency`).
//!
//! Pure parsing and formatting: nothing here knows HTTP or an engine.

use crate::protocol::error::ApiError;

/// The request and response header that carries a bookmark.
pub(crate) const BOOKMARK_HEADER: &str = "sqlhttp-bookmark";

/// The request header that asks for the primary (`primary`) or the default (`session`).
pub(crate) const CONSISTENCY_HEADER: &str = "sqlhttp-consistency";

/// The response header that says which node served the answer: `primary` or `replica`.
pub(crate) const SERVED_BY_HEADER: &str = "sqlhttp-served-by";

/// A database position, as ordered as the log it is a position in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Bookmark(pub(crate) u64);

impl Bookmark {
    /// A bookmark from a client: exactly 16 hexadecimal digits (either case); `400
    /// BAD_REQUEST` otherwise.
    pub(crate) fn parse(text: &str) -> Result<Bookmark, ApiError> {
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ApiError::bad_request(format!(
                "the {BOOKMARK_HEADER} header must be a bookmark this server sent (16 \
                 hexadecimal digits), not {:?}",
                text.chars().take(40).collect::<String>()
            )));
        }
        u64::from_str_radix(text, 16)
            .map(Bookmark)
            .map_err(|_| ApiError::bad_request("the bookmark is not a number"))
    }

    /// PostgreSQL's text for a log position (`pg_lsn`: two hexadecimal numbers of at most 8
    /// digits each, `16/B374D848`); `None` for anything else.
    pub(crate) fn from_lsn(text: &str) -> Option<Bookmark> {
        let (high, low) = text.split_once('/')?;
        let part = |digits: &str| {
            (!digits.is_empty() && digits.len() <= 8)
                .then(|| u32::from_str_radix(digits, 16).ok())
                .flatten()
        };
        Some(Bookmark(
            (u64::from(part(high)?) << 32) | u64::from(part(low)?),
        ))
    }
}

impl std::fmt::Display for Bookmark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Where a request's read may run, from its headers; the default reads where the engine
/// routes it, consistent with nothing in particular.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ReadAt {
    /// The least position the answer must be consistent with (`Sqlhttp-Bookmark`).
    pub(crate) min: Option<Bookmark>,
    /// `Sqlhttp-Consistency: primary`: the primary serves it.
    pub(crate) primary: bool,
}

impl ReadAt {
    /// From the headers' values (`None` when absent); `400 BAD_REQUEST` for a malformed one.
    pub(crate) fn parse(
        bookmark: Option<&str>,
        consistency: Option<&str>,
    ) -> Result<ReadAt, ApiError> {
        let min = bookmark
            .map(|text| Bookmark::parse(text.trim()))
            .transpose()?;
        let primary = match consistency.map(str::trim) {
            None | Some("session") => false,
            Some("primary") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the {CONSISTENCY_HEADER} header is `session` (the default) or `primary`, \
                     not {:?}",
                    other.chars().take(40).collect::<String>()
                )));
            }
        };
        Ok(ReadAt { min, primary })
    }
}

/// Which node served an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServedBy {
    Primary,
    Replica,
}

impl ServedBy {
    /// The `Sqlhttp-Served-By` value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ServedBy::Primary => "primary",
            ServedBy::Replica => "replica",
        }
    }
}

/// Where an answer stands: the position it is consistent with, and who served it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) bookmark: Bookmark,
    pub(crate) served_by: ServedBy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bookmark_is_sixteen_hex_digits_and_orders_as_its_text() {
        let low = Bookmark::from_lsn("0/16B3748").unwrap();
        let high = Bookmark::from_lsn("1/0").unwrap();
        assert!(low < high);
        assert!(low.to_string() < high.to_string());
        assert_eq!(high.to_string(), "0000000100000000");
        assert_eq!(Bookmark::parse(&low.to_string()).unwrap(), low);
        assert_eq!(
            Bookmark::parse("00000001000000AB").unwrap(),
            Bookmark::from_lsn("1/AB").unwrap()
        );
    }

    #[test]
    fn malformed_bookmarks_and_lsns_are_refused() {
        for bad in [
            "",
            "0",
            "000000010000000",
            "00000001000000000",
            "zzzzzzzzzzzzzzzz",
            "+000000000000001",
        ] {
            assert!(Bookmark::parse(bad).is_err(), "{bad:?}");
        }
        for bad in ["", "1", "/1", "1/", "123456789/0", "g/0", "1/2/3"] {
            assert_eq!(Bookmark::from_lsn(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn consistency_is_session_or_primary() {
        assert_eq!(ReadAt::parse(None, None).unwrap(), ReadAt::default());
        assert!(ReadAt::parse(None, Some("primary")).unwrap().primary);
        assert!(!ReadAt::parse(None, Some("session")).unwrap().primary);
        assert!(ReadAt::parse(None, Some("strong")).is_err());
        assert!(ReadAt::parse(Some("nope"), None).is_err());
    }
}
