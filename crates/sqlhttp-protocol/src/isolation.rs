//! [`Isolation`]: the isolation levels a batch or an interactive transaction may ask for, by the
//! names the bodies carry (`"isolation"`). Which engine offers which is the server's to say.

use std::fmt;
use std::str::FromStr;

/// A transaction's isolation level. SQLite's transactions are serializable only (the server
/// refuses the others there); PostgreSQL offers all three. Serializes (serde) as its protocol
/// name ([`as_str`](Self::as_str)).
///
/// Not `#[non_exhaustive]`: a new level is a protocol change (ADR 0048), and the server's
/// engines must be made to handle it where they match on the level.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// As if the transactions ran one after another (`serializable`). On PostgreSQL one of two
    /// conflicting transactions then fails with `TRANSACTION_ABORTED`, to be run again.
    #[default]
    Serializable,
    /// One snapshot for the whole transaction (`repeatable_read`; PostgreSQL).
    RepeatableRead,
    /// Each statement sees what committed before it (`read_committed`; PostgreSQL).
    ReadCommitted,
}

impl Isolation {
    /// Every level, in the order the protocol lists them.
    pub const ALL: [Isolation; 3] = [
        Isolation::Serializable,
        Isolation::RepeatableRead,
        Isolation::ReadCommitted,
    ];

    /// The protocol's name: `serializable`, `repeatable_read` or `read_committed`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Isolation::Serializable => "serializable",
            Isolation::RepeatableRead => "repeatable_read",
            Isolation::ReadCommitted => "read_committed",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of the protocol's isolation levels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownIsolation;

impl fmt::Display for UnknownIsolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "an isolation level is \"serializable\", \"repeatable_read\" or \"read_committed\"",
        )
    }
}

impl std::error::Error for UnknownIsolation {}

impl FromStr for Isolation {
    type Err = UnknownIsolation;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Isolation::ALL
            .into_iter()
            .find(|level| level.as_str() == name)
            .ok_or(UnknownIsolation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_serde() {
        for level in Isolation::ALL {
            assert_eq!(level.as_str().parse::<Isolation>(), Ok(level));
            let json = serde_json::to_string(&level).unwrap();
            assert_eq!(json, format!("\"{level}\""));
            assert_eq!(serde_json::from_str::<Isolation>(&json).unwrap(), level);
        }
        assert_eq!("snapshot".parse::<Isolation>(), Err(UnknownIsolation));
        assert_eq!("".parse::<Isolation>(), Err(UnknownIsolation));
    }
}
