//! The one writer of a statement's success body, `{"columns":[...],"rows":[...],
//! "rows_affected":N,"last_insert_id":...}` in that order, shared by both engines.
//!
//! An engine writes the [`header`], then each row through a [`RowWriter`] (it writes each cell's
//! JSON itself, in its own type mapping, and the writer frames the row and bounds its size), then
//! the [`end`] (or [`end_at`], which names the body's bookmark after the rest), which ends with
//! what the statement cost ([`Cost`], written as the body's last member, `stats`); a body cut after
//! a whole row (streamed, then stopped) is closed with [`error_tail`]. [`within_buffered_limit`]
//! is the limit of a body held whole. Knows the wire format and the protocol's errors; nothing
//! about HTTP or any engine. Written by hand for speed, cell by cell; the tests read what it
//! writes with the protocol crate's typed bodies (`QueryResult`, `StreamedFailure`).

use std::io::Write as _;
use std::time::{Duration, Instant};

use crate::protocol::bookmark::{Bookmark, ServedBy};
use crate::protocol::error::{ApiError, ErrorCode};

/// Writes `{"columns":[{"name":..,"type":..},...],"rows":[` for `columns`, each a name and its
/// declared type (`""` when the engine declares none).
pub(crate) fn header<'c>(out: &mut Vec<u8>, columns: impl IntoIterator<Item = (&'c str, &'c str)>) {
    header_open(out);
    for (index, (name, type_name)) in columns.into_iter().enumerate() {
        header_column(out, index, name, type_name);
    }
    header_close(out);
}

/// Opens the header, for an engine whose columns are not at hand as borrowed names (see
/// [`header`]).
pub(crate) fn header_open(out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"columns\":[");
}

/// Writes column `index` of the header.
pub(crate) fn header_column(out: &mut Vec<u8>, index: usize, name: &str, type_name: &str) {
    if index > 0 {
        out.push(b',');
    }
    out.extend_from_slice(b"{\"name\":");
    string(out, name);
    out.extend_from_slice(b",\"type\":");
    string(out, type_name);
    out.push(b'}');
}

/// Closes the header and opens the rows.
pub(crate) fn header_close(out: &mut Vec<u8>) {
    out.extend_from_slice(b"],\"rows\":[");
}

/// Writes `s` as a JSON string.
pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Frames the rows of one body, each `[cell,...]` after a comma but the first, and bounds each
/// row's JSON by `--max-result-bytes`: a row is written whole before any sink looks at it.
#[derive(Debug)]
pub(crate) struct RowWriter {
    rows: u64,
    start: usize,
    max_row_bytes: usize,
}

impl RowWriter {
    /// A writer of rows of at most `max_row_bytes` bytes of JSON each.
    pub(crate) fn new(max_row_bytes: usize) -> RowWriter {
        RowWriter {
            rows: 0,
            start: 0,
            max_row_bytes,
        }
    }

    /// Rows written whole so far.
    pub(crate) fn rows(&self) -> u64 {
        self.rows
    }

    /// Opens the next row.
    pub(crate) fn begin(&mut self, out: &mut Vec<u8>) {
        self.start = out.len();
        if self.rows > 0 {
            out.push(b',');
        }
        out.push(b'[');
    }

    /// Writes what comes before cell `index` of the open row.
    pub(crate) fn cell(&self, out: &mut Vec<u8>, index: usize) {
        if index > 0 {
            out.push(b',');
        }
    }

    /// After a cell: refuses the row (and takes it back) once its JSON outgrows the limit.
    pub(crate) fn check(&self, out: &mut Vec<u8>) -> Result<(), ApiError> {
        if out.len() - self.start > self.max_row_bytes {
            self.discard(out);
            return Err(ApiError::row_too_large(self.max_row_bytes, self.rows + 1));
        }
        Ok(())
    }

    /// Takes the open row back (a cell could not be written): `out` ends after a whole row.
    pub(crate) fn discard(&self, out: &mut Vec<u8>) {
        out.truncate(self.start);
    }

    /// Closes the open row; returns the rows written whole.
    pub(crate) fn end(&mut self, out: &mut Vec<u8>) -> u64 {
        out.push(b']');
        self.rows += 1;
        self.rows
    }
}

/// What a statement cost, as its body's `stats` says (see `docs/protocol.md`, "Tracing and
/// stats").
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cost {
    /// When the engine began the statement (after its turn came).
    pub(crate) began: Instant,
    /// Rows the engine read, where it counts them.
    pub(crate) rows_read: Option<u64>,
    /// Who served it.
    pub(crate) served_by: ServedBy,
}

impl Cost {
    /// A statement beginning now on `served_by`.
    pub(crate) fn now(served_by: ServedBy) -> Cost {
        Cost {
            began: Instant::now(),
            rows_read: None,
            served_by,
        }
    }
}

/// Writes `n` in decimal: every integer of a body (cells, counts, ids) passes here, without
/// the formatting machinery.
pub(crate) fn integer(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Writes `took` in milliseconds with microsecond precision: `12.345`.
pub(crate) fn millis(out: &mut Vec<u8>, took: Duration) {
    let micros = took.as_micros();
    integer(out, micros / 1000);
    let fraction = micros % 1000;
    out.extend_from_slice(&[
        b'.',
        b'0' + (fraction / 100) as u8,
        b'0' + (fraction / 10 % 10) as u8,
        b'0' + (fraction % 10) as u8,
    ]);
}

/// Writes `,"stats":{...}` (the body's last member, before its closing brace): the time since
/// `began`, in milliseconds with microsecond precision, and the counts that are known.
pub(crate) fn stats(
    out: &mut Vec<u8>,
    took: Duration,
    rows_read: Option<u64>,
    rows_written: Option<u64>,
    served_by: ServedBy,
) {
    out.extend_from_slice(b",\"stats\":{\"duration_ms\":");
    millis(out, took);
    if let Some(read) = rows_read {
        out.extend_from_slice(b",\"rows_read\":");
        integer(out, read);
    }
    if let Some(written) = rows_written {
        out.extend_from_slice(b",\"rows_written\":");
        integer(out, written);
    }
    out.extend_from_slice(b",\"served_by\":\"");
    out.extend_from_slice(served_by.as_str().as_bytes());
    out.extend_from_slice(b"\"}");
}

/// Closes a body whose rows are all written: `],"rows_affected":N,"last_insert_id":ID,
/// "stats":{...}}`, the id `null` when there is none (PostgreSQL has no rowid).
pub(crate) fn end(out: &mut Vec<u8>, rows_affected: u64, last_insert_id: Option<i64>, cost: Cost) {
    end_at(out, rows_affected, last_insert_id, None, cost);
}

/// [`end`], with the position the answer stands at before `stats` when there is one:
/// `...,"last_insert_id":ID,"bookmark":"0000000001a2b3c4","stats":{...}}`. A body that streamed
/// before its position was known (a write's, whose headers went out before it committed) says
/// it here.
pub(crate) fn end_at(
    out: &mut Vec<u8>,
    rows_affected: u64,
    last_insert_id: Option<i64>,
    bookmark: Option<Bookmark>,
    cost: Cost,
) {
    out.extend_from_slice(b"],\"rows_affected\":");
    integer(out, rows_affected);
    out.extend_from_slice(b",\"last_insert_id\":");
    match last_insert_id {
        Some(id) => integer(out, id),
        None => out.extend_from_slice(b"null"),
    }
    if let Some(bookmark) = bookmark {
        let _ = write!(out, ",\"bookmark\":\"{bookmark}\"");
    }
    stats(
        out,
        cost.began.elapsed(),
        cost.rows_read,
        Some(rows_affected),
        cost.served_by,
    );
    out.push(b'}');
}

/// Closes a success body cut after a whole row with the error that stopped it:
/// `],"error":{"code":..,"message":..}}`, with no `rows_affected` or `last_insert_id`.
pub(crate) fn error_tail(out: &mut Vec<u8>, err: &ApiError) {
    out.extend_from_slice(b"],");
    let body = err.body();
    // `{"error":{...}}` without its opening brace.
    out.extend_from_slice(body.get(1..).unwrap_or_default());
}

/// Refuses a body held whole once it is larger than `limit` (`--max-result-bytes`), reached at
/// row `rows`.
pub(crate) fn within_buffered_limit(len: usize, limit: usize, rows: u64) -> Result<(), ApiError> {
    if len > limit {
        return Err(ApiError::new(
            ErrorCode::ResultTooLarge,
            format!(
                "the result is larger than this server's limit of {limit} bytes for a \
                 buffered result (--max-result-bytes), reached at row {rows}; select fewer \
                 rows or columns, or page with LIMIT and a key"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_and_milliseconds_are_written_as_json_numbers() {
        let written = |write: &dyn Fn(&mut Vec<u8>)| {
            let mut out = Vec::new();
            write(&mut out);
            String::from_utf8(out).unwrap()
        };
        for (n, text) in [(0, "0"), (-1, "-1"), (i64::MIN, "-9223372036854775808")] {
            assert_eq!(written(&|out| integer(out, n)), text);
        }
        assert_eq!(
            written(&|out| integer(out, u64::MAX)),
            "18446744073709551615"
        );
        for (micros, text) in [
            (0, "0.000"),
            (7, "0.007"),
            (1_305, "1.305"),
            (1_611_070, "1611.070"),
        ] {
            let took = Duration::from_micros(micros);
            assert_eq!(written(&|out| millis(out, took)), text);
        }
    }

    #[test]
    fn a_body_is_written_in_protocol_order() {
        let mut out = Vec::new();
        header(&mut out, [("a", "INTEGER"), ("b", "")]);
        let mut rows = RowWriter::new(1024);
        for values in [["1", "\"x\""], ["2", "null"]] {
            rows.begin(&mut out);
            for (index, value) in values.iter().enumerate() {
                rows.cell(&mut out, index);
                out.extend_from_slice(value.as_bytes());
                rows.check(&mut out).unwrap();
            }
            rows.end(&mut out);
        }
        let cost = Cost {
            rows_read: Some(9),
            ..Cost::now(ServedBy::Primary)
        };
        end(&mut out, 2, Some(7), cost);
        // The protocol's typed definition (which refuses unknown members) reads it.
        let typed: sqlhttp_protocol::body::QueryResult = serde_json::from_slice(&out).unwrap();
        assert_eq!((typed.rows.len(), typed.last_insert_id), (2, Some(7)));
        assert_eq!(typed.columns[0].type_name, "INTEGER");
        let stats = typed.stats.unwrap();
        assert_eq!((stats.rows_read, stats.rows_written), (Some(9), Some(2)));
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                r#"{"columns":[{"name":"a","type":"INTEGER"},{"name":"b","type":""}],"rows":[[1,"x"],[2,null]],"rows_affected":2,"last_insert_id":7,"stats":{"duration_ms":"#
            ),
            "{text}"
        );
        assert!(
            text.ends_with(r#","rows_read":9,"rows_written":2,"served_by":"primary"}}"#),
            "{text}"
        );
    }

    #[test]
    fn a_bookmark_is_the_last_member_when_there_is_one() {
        let mut out = Vec::new();
        header(&mut out, [("a", "")]);
        let replica = Cost::now(ServedBy::Replica);
        end_at(
            &mut out,
            3,
            None,
            Some(Bookmark::from_position(0x1a2b_3c4d)),
            replica,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                r#"{"columns":[{"name":"a","type":""}],"rows":[],"rows_affected":3,"last_insert_id":null,"bookmark":"000000001a2b3c4d","stats":{"#
            ),
            "{text}"
        );
        assert!(
            text.ends_with(r#""rows_written":3,"served_by":"replica"}}"#),
            "{text}"
        );
        let mut out = Vec::new();
        header(&mut out, [("a", "")]);
        end_at(&mut out, 3, None, Some(Bookmark::from_position(7)), replica);
        let typed: sqlhttp_protocol::body::QueryResult = serde_json::from_slice(&out).unwrap();
        assert_eq!(typed.bookmark, Some(Bookmark::from_position(7)));
        assert_eq!(
            typed.stats.unwrap().served_by,
            Some(sqlhttp_protocol::body::ServedBy::Replica)
        );
    }

    #[test]
    fn a_duration_is_milliseconds_with_microseconds() {
        let mut out = Vec::new();
        stats(
            &mut out,
            Duration::from_micros(1_305),
            None,
            None,
            ServedBy::Primary,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#","stats":{"duration_ms":1.305,"served_by":"primary"}"#
        );
    }

    #[test]
    fn a_row_past_the_limit_is_taken_back_and_named() {
        let mut out = Vec::new();
        header(&mut out, [("a", "")]);
        let mut rows = RowWriter::new(8);
        rows.begin(&mut out);
        rows.cell(&mut out, 0);
        out.extend_from_slice(b"1");
        rows.end(&mut out);
        let whole = out.len();
        rows.begin(&mut out);
        rows.cell(&mut out, 0);
        out.extend_from_slice(b"\"0123456789\"");
        let err = rows.check(&mut out).unwrap_err();
        assert_eq!(err.code, ErrorCode::ResultTooLarge);
        assert!(err.message.contains("row 2"), "{}", err.message);
        assert_eq!(out.len(), whole, "the body ends after the whole first row");
        error_tail(&mut out, &err);
        let typed: sqlhttp_protocol::body::StreamedFailure = serde_json::from_slice(&out).unwrap();
        assert_eq!(typed.error.code, ErrorCode::ResultTooLarge.as_str());
        let body: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(body["rows"], serde_json::json!([[1]]));
        assert_eq!(body["error"]["code"], "RESULT_TOO_LARGE");
    }

    #[test]
    fn a_buffered_body_is_refused_past_its_limit() {
        assert!(within_buffered_limit(10, 10, 1).is_ok());
        let err = within_buffered_limit(11, 10, 3).unwrap_err();
        assert_eq!(err.code, ErrorCode::ResultTooLarge);
        assert!(err.message.contains("reached at row 3"));
    }
}
