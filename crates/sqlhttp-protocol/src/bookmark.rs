//! The [`Bookmark`]: a position in the database's history, as the `Sqlhttp-Bookmark` header and a
//! streamed body's `bookmark` member carry it. Its text is exactly [`BOOKMARK_DIGITS`] hexadecimal
//! digits (written in lower case, read in either), one 64-bit number, so bookmarks order as their
//! text does. Parsing, formatting, ordering and serde; nothing of headers or sessions.

use std::fmt;
use std::str::FromStr;

/// The length of a bookmark's text.
pub const BOOKMARK_DIGITS: usize = 16;

/// A position in the database's history, as the server names it in the `Sqlhttp-Bookmark` header:
/// what an answer is consistent with (a write: at or after its commit; a read: at or after
/// everything it saw).
///
/// Opaque but ordered: a greater bookmark is a later position. Its text is 16 hexadecimal digits
/// (written in lower case; upper case parses too), and it serializes (serde) as that string.
///
/// ```
/// use sqlhttp_protocol::Bookmark;
///
/// let earlier: Bookmark = "000000000169a3f8".parse()?;
/// let later: Bookmark = "00000000016A0010".parse()?;
/// assert!(earlier < later);
/// assert_eq!(later.to_string(), "00000000016a0010");
/// assert!("+000000000169a3f".parse::<Bookmark>().is_err());
/// # Ok::<(), sqlhttp_protocol::ParseBookmarkError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bookmark(u64);

impl Bookmark {
    /// The bookmark of a position (for a PostgreSQL server, its write-ahead-log position as one
    /// number). For servers; a client treats bookmarks as opaque.
    #[must_use]
    pub const fn from_position(position: u64) -> Self {
        Bookmark(position)
    }

    /// The position this bookmark names.
    #[must_use]
    pub const fn position(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Bookmark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Sixteen lower-case hexadecimal digits, written at once: a server names a position
        // in every read's answer, and `{:016x}` costs that many times more.
        let mut digits = [0_u8; 16];
        for (index, digit) in digits.iter_mut().enumerate() {
            let nibble = (self.0 >> (60 - 4 * index)) & 0xf;
            *digit = b"0123456789abcdef"[usize::try_from(nibble).unwrap_or(0)];
        }
        f.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Bookmark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bookmark({self})")
    }
}

/// Why a text is not a [`Bookmark`]: it is not exactly 16 hexadecimal digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseBookmarkError {
    len: usize,
}

impl fmt::Display for ParseBookmarkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a bookmark is exactly 16 hexadecimal digits; this text is not one ({} bytes)",
            self.len
        )
    }
}

impl std::error::Error for ParseBookmarkError {}

impl FromStr for Bookmark {
    type Err = ParseBookmarkError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = ParseBookmarkError { len: text.len() };
        // `from_str_radix` alone would take a leading `+`.
        if text.len() != BOOKMARK_DIGITS || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid);
        }
        u64::from_str_radix(text, 16)
            .map(Bookmark)
            .map_err(|_| invalid)
    }
}

impl serde::Serialize for Bookmark {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Bookmark {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Bookmark;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a bookmark (16 hexadecimal digits)")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Bookmark, E> {
                text.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_and_orders_as_the_positions() {
        let low: Bookmark = "0000000000000001".parse().unwrap();
        let high: Bookmark = "00000001000000A0".parse().unwrap();
        assert!(low < high);
        assert!(low.to_string() < high.to_string());
        assert_eq!(high.to_string(), "00000001000000a0");
        assert_eq!(high.position(), 0x1_0000_00a0);
        assert_eq!(Bookmark::from_position(high.position()), high);
        assert_eq!(high.to_string().parse::<Bookmark>().unwrap(), high);
        for bad in [
            "",
            "1",
            "000000010000000",
            "00000000000000001",
            "000000000000000g",
            "zzzzzzzzzzzzzzzz",
            "+000000000000001",
            " 000000000000001",
            "００００",
        ] {
            assert!(bad.parse::<Bookmark>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bookmark_is_its_position_in_sixteen_lower_case_hex_digits() {
        for position in [0, 1, 0xa, 0x16a_0010, 0xfedc_ba98_7654_3210, u64::MAX] {
            let text = Bookmark::from_position(position).to_string();
            assert_eq!(text, format!("{position:016x}"));
        }
    }

    #[test]
    fn serde_carries_the_string() {
        let bookmark: Bookmark = "00000000016a0010".parse().unwrap();
        let json = serde_json::to_string(&bookmark).unwrap();
        assert_eq!(json, "\"00000000016a0010\"");
        assert_eq!(serde_json::from_str::<Bookmark>(&json).unwrap(), bookmark);
        assert!(serde_json::from_str::<Bookmark>("\"xyz\"").is_err());
        assert!(serde_json::from_str::<Bookmark>("23").is_err());
    }
}
