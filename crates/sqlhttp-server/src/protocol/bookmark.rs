//! Bookmarks as the server reads them: the [`Bookmark`] and its text are the protocol crate's
//! (`sqlhttp_protocol`, ADR 0048); here a client's bookmark refused as a `400 BAD_REQUEST`, a
//! PostgreSQL write-ahead-log position (`16/B374D848`) read as one, and [`ReadAt`], what a
//! request asks of where its read runs (`Sqlhttp-Consistency`). See `docs/protocol.md`, "Read
//! replicas and bookmarks", and ADR 0039.
//!
//! Pure parsing: nothing here knows HTTP or an engine, nor defines a name of the protocol.

use crate::protocol::error::ApiError;

pub(crate) use sqlhttp_protocol::Bookmark;
pub(crate) use sqlhttp_protocol::header::{
    BOOKMARK as BOOKMARK_HEADER, CONSISTENCY as CONSISTENCY_HEADER, SERVED_BY as SERVED_BY_HEADER,
};
use sqlhttp_protocol::header::{
    CONSISTENCY_PRIMARY, CONSISTENCY_SESSION, SERVED_BY_PRIMARY, SERVED_BY_REPLICA,
};

/// A bookmark from a client: exactly 16 hexadecimal digits (either case); `400 BAD_REQUEST`
/// otherwise.
pub(crate) fn parse(text: &str) -> Result<Bookmark, ApiError> {
    text.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "the {BOOKMARK_HEADER} header must be a bookmark this server sent (16 \
             hexadecimal digits), not {:?}",
            text.chars().take(40).collect::<String>()
        ))
    })
}

/// PostgreSQL's text for a log position (`pg_lsn`: two hexadecimal numbers of at most 8
/// digits each, `16/B374D848`) as a bookmark; `None` for anything else.
pub(crate) fn from_lsn(text: &str) -> Option<Bookmark> {
    let (high, low) = text.split_once('/')?;
    let part = |digits: &str| {
        (!digits.is_empty() && digits.len() <= 8)
            .then(|| u32::from_str_radix(digits, 16).ok())
            .flatten()
    };
    Some(Bookmark::from_position(
        (u64::from(part(high)?) << 32) | u64::from(part(low)?),
    ))
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
        let min = bookmark.map(|text| parse(text.trim())).transpose()?;
        let primary = match consistency.map(str::trim) {
            None | Some(CONSISTENCY_SESSION) => false,
            Some(CONSISTENCY_PRIMARY) => true,
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
            ServedBy::Primary => SERVED_BY_PRIMARY,
            ServedBy::Replica => SERVED_BY_REPLICA,
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
    fn an_lsn_is_the_bookmark_of_its_position() {
        let low = from_lsn("0/16B3748").unwrap();
        let high = from_lsn("1/0").unwrap();
        assert!(low < high);
        assert_eq!(high.to_string(), "0000000100000000");
        assert_eq!(parse(&low.to_string()).unwrap(), low);
        assert_eq!(
            parse("00000001000000AB").unwrap(),
            from_lsn("1/AB").unwrap()
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
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        for bad in ["", "1", "/1", "1/", "123456789/0", "g/0", "1/2/3"] {
            assert_eq!(from_lsn(bad), None, "{bad:?}");
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
