//! What a call cost: [`Stats`], on every result type ([`ExecResult`](crate::ExecResult),
//! [`Table`](crate::Table), a [`RowStream`](crate::RowStream) once it has ended, a
//! [`BatchReport`](crate::BatchReport)): the server's own figures from the body's `stats` member
//! (the engine's time, rows read and written, which node served it) and the call's attempt count.
//!
//! Plain data, and the lenient reading of the wire's member: a body without `stats` (an older
//! server), or with members missing, unknown or not of their type, is read, what is missing being
//! `None`. It knows the member's shape, not where in a body it stands (`wire` finds it).

use std::time::Duration;

/// Which node served an answer: the primary or a read replica (`served_by` in the protocol; the
/// protocol crate's type, re-exported). A value of a later protocol version is
/// [`ServedBy::Other`].
pub use sqlhttp_protocol::body::ServedBy;

/// What a call cost, as the server reported it and as the SDK counted it.
///
/// Every server figure is `None` when the server did not report it (a server older than the
/// protocol's `stats`, or an engine that does not count it: `rows_read` is SQLite's rows stepped
/// and PostgreSQL's rows returned). A keyed write answered from the server's idempotency store
/// (its answer lost, and the call retried) carries the first execution's figures, as the replay
/// answers what the first execution said; [`total_attempts`](Self::total_attempts) is this
/// call's.
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// let table = client.query_table("SELECT id FROM books").await?;
/// let stats = table.stats();
/// println!(
///     "{:?} on the server ({:?}), {:?} rows read, {} attempt(s)",
///     stats.duration, stats.served_by, stats.rows_read, stats.total_attempts
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Stats {
    /// The engine's time for the statement(s), without the wait for its turn (to microseconds).
    pub duration: Option<Duration>,
    /// Rows the engine read to answer, where it counts them.
    pub rows_read: Option<u64>,
    /// Rows the statement(s) inserted, updated or deleted.
    pub rows_written: Option<u64>,
    /// Which node served the answer.
    pub served_by: Option<ServedBy>,
    /// How many attempts the call took (the first one included; as Cloudflare D1's
    /// `total_attempts`); 0 for a result that no call made (an empty batch).
    pub total_attempts: u32,
}

impl Stats {
    /// The figures of a body's `stats` member (a JSON value), with the call's attempt count.
    pub(crate) fn from_wire(server: Option<&ServerStats>, total_attempts: u32) -> Self {
        let server = server.copied().unwrap_or_default();
        Self {
            duration: server.duration,
            rows_read: server.rows_read,
            rows_written: server.rows_written,
            served_by: server.served_by,
            total_attempts,
        }
    }
}

/// The server's figures, as read from a body's `stats` member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServerStats {
    pub(crate) duration: Option<Duration>,
    pub(crate) rows_read: Option<u64>,
    pub(crate) rows_written: Option<u64>,
    pub(crate) served_by: Option<ServedBy>,
}

impl ServerStats {
    /// Reads a `stats` member's JSON text: each member on its own, one missing or not of its
    /// type being `None`; `None` when the member is not an object.
    pub(crate) fn read(json: &str) -> Option<Self> {
        use serde_json::value::RawValue;
        /// The member's members as they came, unparsed (borrowed: nothing is allocated);
        /// members this version does not know are skipped.
        #[derive(serde::Deserialize)]
        struct Members<'a> {
            #[serde(borrow, default)]
            duration_ms: Option<&'a RawValue>,
            #[serde(borrow, default)]
            rows_read: Option<&'a RawValue>,
            #[serde(borrow, default)]
            rows_written: Option<&'a RawValue>,
            #[serde(borrow, default)]
            served_by: Option<&'a RawValue>,
        }
        fn parse<'a, T: serde::Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
            serde_json::from_str(raw?.get()).ok()
        }
        // An object only (a derived struct would take an array by position).
        if !json.trim_start().starts_with('{') {
            return None;
        }
        let members: Members<'_> = serde_json::from_str(json).ok()?;
        let duration = parse::<f64>(members.duration_ms)
            .and_then(|ms| Duration::try_from_secs_f64(ms / 1_000.0).ok())
            // Microsecond precision, as the protocol gives it.
            .map(|d| Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)));
        Some(Self {
            duration,
            rows_read: parse(members.rows_read),
            rows_written: parse(members.rows_written),
            served_by: parse(members.served_by),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_is_read() {
        let read = ServerStats::read(
            r#"{"duration_ms":1.305,"rows_read":7,"rows_written":2,"served_by":"replica"}"#,
        )
        .unwrap();
        assert_eq!(read.duration, Some(Duration::from_micros(1_305)));
        assert_eq!(read.rows_read, Some(7));
        assert_eq!(read.rows_written, Some(2));
        assert_eq!(read.served_by, Some(ServedBy::Replica));
    }

    /// Members missing, unknown, or not of their type are `None`; the others are read.
    #[test]
    fn a_reader_is_lenient() {
        let read = ServerStats::read(
            r#"{"duration_ms":"slow","rows_read":-1,"next":{"a":1},"served_by":"edge"}"#,
        )
        .unwrap();
        assert_eq!(read.duration, None);
        assert_eq!(read.rows_read, None);
        assert_eq!(read.rows_written, None);
        assert_eq!(read.served_by, Some(ServedBy::Other));
        assert_eq!(ServerStats::read("{}"), Some(ServerStats::default()));
        assert_eq!(ServerStats::read("null"), None);
        assert_eq!(ServerStats::read("[1]"), None);
        let negative = ServerStats::read(r#"{"duration_ms":-3,"served_by":7}"#).unwrap();
        assert_eq!((negative.duration, negative.served_by), (None, None));
    }

    #[test]
    fn stats_carry_the_call_s_attempts() {
        let server = ServerStats {
            rows_written: Some(1),
            ..ServerStats::default()
        };
        let stats = Stats::from_wire(Some(&server), 2);
        assert_eq!((stats.rows_written, stats.total_attempts), (Some(1), 2));
        assert_eq!(Stats::from_wire(None, 1).duration, None);
    }
}
