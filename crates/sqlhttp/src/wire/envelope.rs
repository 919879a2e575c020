//! The protocol v1 success body read as it arrives: [`Decoder`] takes the body in pieces of any
//! size, finds the envelope's members (`columns`, `rows`, `rows_affected`, `last_insert_id`, the
//! `bookmark` a write that committed after its headers were sent ends with, the `stats` every
//! success ends with, and the `error` a streamed body may end with) and hands each complete row to the typed row decoder in `decode`,
//! one row at a time.
//!
//! It holds at most the row being received and the piece that completed it, whatever the result's
//! size. It knows the envelope's grammar and nothing of HTTP, retries or the caller's types beyond
//! `DeserializeOwned`; every body, streamed or whole, is decoded here, so there is one decoder.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny};
use serde_json::value::RawValue;
use sqlhttp_protocol::body::member;

use super::decode::{Position, RowSeed, RowsSeed, positioned};
use crate::bookmark::{self, Bookmark};
use crate::error::{Error, ErrorKind};
use crate::stats::ServerStats;
use crate::table::Column;

/// What the decoder can give now.
#[derive(Debug)]
pub(crate) enum Step<T> {
    /// The next row.
    Row(T),
    /// The buffered bytes end inside the body: push more.
    NeedMore,
    /// The body ended, and every row was given.
    End,
}

/// What [`Decoder::advance`] stopped at.
enum Advance {
    Row,
    NeedMore,
    End,
}

/// What reading at a row's place did.
enum RowStep {
    /// A row went to the sink.
    Row,
    /// The bytes end inside the row.
    NeedMore,
    /// The rows ended; the state moved on.
    Moved,
}

/// Where the decoder is in the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the opening brace.
    Start,
    /// Before a member's key, or the closing brace.
    Key { first: bool },
    /// Before the value of the member named so.
    Value(Member),
    /// Inside `rows`, before a row or the closing bracket.
    Rows { first: bool },
    /// After the closing brace.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Columns,
    Rows,
    RowsAffected,
    LastInsertId,
    Bookmark,
    Stats,
    Error,
    Other,
}

/// A statement's effect, as the body's last members give it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Effect {
    pub(crate) rows_affected: Option<u64>,
    pub(crate) last_insert_id: Option<i64>,
}

/// Reads one success body, piece by piece, into `T`s.
pub(crate) struct Decoder<'a, T> {
    /// Borrowed when the whole body was given at once; owned (and refilled) when it arrives in pieces.
    buf: Cow<'a, [u8]>,
    pos: usize,
    /// No more input will come.
    eof: bool,
    state: State,
    columns: Option<Vec<Column>>,
    position: Position,
    rows: usize,
    seen_rows: bool,
    /// Rows that came before the columns, decoded once the names were known.
    early: Option<Box<RawValue>>,
    ready: VecDeque<T>,
    effect: Effect,
    /// The position the answer is consistent with, when the body named a valid one at its end.
    bookmark: Option<Bookmark>,
    /// What the answer cost the server, when the body named it (its last member): its text,
    /// read into figures only when asked (a stream's caller rarely asks, and reading it costs
    /// more than keeping it).
    stats: Option<Box<RawValue>>,
    /// The server's error, once the body said the result ends with one.
    failed: Option<ErrorKind>,
    marker: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Decoder<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("state", &self.state)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> Default for Decoder<'_, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Decoder<'_, T> {
    /// The result's columns, once read.
    pub(crate) fn columns(&self) -> Option<&[Column]> {
        self.columns.as_deref()
    }

    /// The statement's effect, complete once [`Step::End`] was given.
    pub(crate) fn effect(&self) -> Effect {
        self.effect
    }

    /// Rows given so far.
    pub(crate) fn rows_given(&self) -> usize {
        self.rows
    }

    /// The bookmark the body named (its `bookmark` member), once read and when well formed.
    pub(crate) fn bookmark(&self) -> Option<Bookmark> {
        self.bookmark
    }

    /// The server's figures (the body's `stats` member), once read; `None` from a server that
    /// does not send them, or when the member is not an object. Read off the member's text at
    /// each call.
    pub(crate) fn stats(&self) -> Option<ServerStats> {
        ServerStats::read(self.stats.as_deref()?.get())
    }
}

/// A JSON value could not be read from the buffer yet, or not at all.
enum Parse<V> {
    Value(V, usize),
    NeedMore,
}

impl<'a, T: DeserializeOwned> Decoder<'a, T> {
    pub(crate) fn new() -> Self {
        Self {
            buf: Cow::Owned(Vec::new()),
            pos: 0,
            eof: false,
            state: State::Start,
            columns: None,
            position: Position::default(),
            rows: 0,
            seen_rows: false,
            early: None,
            ready: VecDeque::new(),
            effect: Effect::default(),
            bookmark: None,
            stats: None,
            failed: None,
            marker: PhantomData,
        }
    }

    /// A decoder over a whole body, read in place.
    pub(crate) fn whole(body: &'a [u8]) -> Self {
        Self {
            buf: Cow::Borrowed(body),
            eof: true,
            ..Self::new()
        }
    }

    /// Forgets everything read, for another attempt.
    pub(crate) fn reset(&mut self) {
        *self = Self::new();
    }

    /// Appends the next piece of the body.
    pub(crate) fn push(&mut self, piece: &[u8]) {
        let buf = self.buf.to_mut();
        if self.pos > 0 {
            // What is left is at most one partial row.
            buf.drain(..self.pos);
            self.pos = 0;
        }
        buf.extend_from_slice(piece);
    }

    /// Says the body has ended.
    pub(crate) fn finish(&mut self) {
        self.eof = true;
    }

    /// The next row, or what the decoder needs to give one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Decode`] naming the row and column when a row does not decode into `T` or the
    /// body is not a protocol v1 result; the server's own error when the body ends with one.
    pub(crate) fn next(&mut self) -> Result<Step<T>, Error> {
        let mut row = None;
        match self.advance(&mut |decoded| row = Some(decoded), true)? {
            Advance::Row => Ok(Step::Row(row.expect("a row was decoded"))),
            Advance::NeedMore => Ok(Step::NeedMore),
            Advance::End => Ok(Step::End),
        }
    }

    /// Decodes every row the buffered bytes hold into `rows`, moving each once: the loop of the
    /// buffered calls. Returns [`Step::NeedMore`] or [`Step::End`], never a row.
    ///
    /// # Errors
    ///
    /// As [`next`](Self::next).
    pub(crate) fn drain_into(&mut self, rows: &mut Vec<T>) -> Result<Step<()>, Error> {
        match self.advance(&mut |row| rows.push(row), false)? {
            Advance::Row => unreachable!("advance stops at a row only when asked to"),
            Advance::NeedMore => Ok(Step::NeedMore),
            Advance::End => Ok(Step::End),
        }
    }

    /// Hands decoded rows to `sink` until the bytes run out or the body ends, or after one row
    /// when `one` is set.
    fn advance(&mut self, sink: &mut dyn FnMut(T), one: bool) -> Result<Advance, Error> {
        loop {
            if let Some(row) = self.ready.pop_front() {
                self.rows += 1;
                sink(row);
                if one {
                    return Ok(Advance::Row);
                }
                continue;
            }
            match self.state {
                State::Done => {
                    return self.end().map(|step| match step {
                        Step::End => Advance::End,
                        _ => Advance::NeedMore,
                    });
                }
                State::Rows { first } => match self.row(first, sink)? {
                    RowStep::Row => {
                        self.rows += 1;
                        if one {
                            return Ok(Advance::Row);
                        }
                    }
                    RowStep::NeedMore => return Ok(Advance::NeedMore),
                    RowStep::Moved => {}
                },
                _ => {
                    if !self.envelope()? {
                        return self.need_more().map(|_| Advance::NeedMore);
                    }
                }
            }
        }
    }

    fn need_more(&self) -> Result<Step<T>, Error> {
        if self.eof {
            Err(malformed("the body ended before the end of the result"))
        } else {
            Ok(Step::NeedMore)
        }
    }

    fn end(&mut self) -> Result<Step<T>, Error> {
        if let Some(kind) = self.failed.take() {
            return Err(Error::new(kind).with_sent(true, false));
        }
        if !self.eof {
            // Trailing bytes may still come; only whitespace is allowed.
            return if self.rest_is_whitespace() {
                Ok(Step::NeedMore)
            } else {
                Err(malformed("trailing characters after the result"))
            };
        }
        if self.rest_is_whitespace() {
            Ok(Step::End)
        } else {
            Err(malformed("trailing characters after the result"))
        }
    }

    fn rest_is_whitespace(&self) -> bool {
        self.buf[self.pos..].iter().all(u8::is_ascii_whitespace)
    }

    /// The first byte after whitespace from `at`, and its position.
    fn peek_from(&self, at: usize) -> Option<(u8, usize)> {
        self.buf[at..]
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .map(|offset| (self.buf[at + offset], at + offset))
    }

    /// Reads one value of the envelope (not a row); `Ok(false)` when more bytes are needed.
    fn envelope(&mut self) -> Result<bool, Error> {
        let Some((byte, at)) = self.peek_from(self.pos) else {
            return Ok(false);
        };
        match self.state {
            State::Start => {
                if byte != b'{' {
                    return Err(malformed("expected a query response object"));
                }
                self.pos = at + 1;
                self.state = State::Key { first: true };
            }
            State::Key { first } => {
                let mut at = at;
                let mut byte = byte;
                if byte == b'}' {
                    self.pos = at + 1;
                    self.state = State::Done;
                    return self.close_envelope().map(|()| true);
                }
                if !first {
                    if byte != b',' {
                        return Err(malformed("expected `,` or `}` between members"));
                    }
                    let Some(next) = self.peek_from(at + 1) else {
                        return Ok(false);
                    };
                    (byte, at) = next;
                }
                if byte != b'"' {
                    return Err(malformed("expected a member name"));
                }
                let Parse::Value(key, end) = self.parse_at::<String>(at)? else {
                    return Ok(false);
                };
                let member = match key.as_ref() {
                    member::COLUMNS => Member::Columns,
                    member::ROWS => Member::Rows,
                    member::ROWS_AFFECTED => Member::RowsAffected,
                    member::LAST_INSERT_ID => Member::LastInsertId,
                    member::BOOKMARK => Member::Bookmark,
                    member::STATS => Member::Stats,
                    member::ERROR => Member::Error,
                    _ => Member::Other,
                };
                let Some((colon, at)) = self.peek_from(end) else {
                    return Ok(false);
                };
                if colon != b':' {
                    return Err(malformed("expected `:` after a member name"));
                }
                self.pos = at + 1;
                self.state = State::Value(member);
            }
            State::Value(member) => return self.member(member, at),
            State::Rows { .. } | State::Done => unreachable!("handled by next"),
        }
        Ok(true)
    }

    fn member(&mut self, member: Member, at: usize) -> Result<bool, Error> {
        macro_rules! value {
            ($ty:ty) => {
                match self.parse_at::<$ty>(at)? {
                    Parse::Value(value, end) => {
                        self.pos = end;
                        value
                    }
                    Parse::NeedMore => return Ok(false),
                }
            };
        }
        match member {
            Member::Columns => {
                let columns: Vec<Column> = value!(Vec<Column>);
                self.columns = Some(columns);
            }
            Member::Rows if self.columns.is_some() => {
                if self.buf[at] != b'[' {
                    return Err(malformed("`rows` must be an array"));
                }
                self.pos = at + 1;
                self.seen_rows = true;
                self.position.in_rows.set(true);
                self.state = State::Rows { first: true };
                return Ok(true);
            }
            Member::Rows => {
                let raw: Box<RawValue> = value!(Box<RawValue>);
                self.seen_rows = true;
                self.early = Some(raw);
            }
            Member::RowsAffected => {
                let affected: u64 = value!(u64);
                self.effect.rows_affected = Some(affected);
            }
            Member::LastInsertId => {
                let id: Option<i64> = value!(Option<i64>);
                self.effect.last_insert_id = id;
            }
            Member::Bookmark => {
                // Any JSON value is read; only a well-formed bookmark is kept.
                let raw: Box<RawValue> = value!(Box<RawValue>);
                if let Some(found) = bookmark::from_body_member(raw.get()) {
                    self.bookmark = self.bookmark.max(Some(found));
                }
            }
            Member::Stats => {
                // Any JSON value is read; its members are taken one by one, leniently.
                self.stats = Some(value!(Box<RawValue>));
            }
            Member::Error => {
                let raw: Box<RawValue> = value!(Box<RawValue>);
                self.failed = Some(crate::response::from_body_error(raw.get()));
            }
            Member::Other => {
                let _: IgnoredAny = value!(IgnoredAny);
            }
        }
        self.state = State::Key { first: false };
        Ok(true)
    }

    /// Checks what the closed envelope held; decodes rows that came before the columns.
    fn close_envelope(&mut self) -> Result<(), Error> {
        if self.failed.is_some() {
            return Ok(());
        }
        let Some(columns) = &self.columns else {
            return Err(malformed("missing field `columns`"));
        };
        if let Some(raw) = self.early.take() {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let seed = RowsSeed::<T>::new(&self.position, columns);
            let rows = seed
                .deserialize(&mut de)
                .map_err(|err| positioned::<T>(&err, &self.position, columns))?;
            self.ready.extend(rows);
            return Ok(());
        }
        if !self.seen_rows {
            return Err(malformed("missing field `rows`"));
        }
        Ok(())
    }

    /// Reads the next row, the end of the rows, or nothing (`Ok(None)`: the state moved on).
    fn row(&mut self, first: bool, sink: &mut dyn FnMut(T)) -> Result<RowStep, Error> {
        let Some((mut byte, mut at)) = self.peek_from(self.pos) else {
            return self.need_more().map(|_| RowStep::NeedMore);
        };
        if byte == b']' {
            self.pos = at + 1;
            self.position.in_rows.set(false);
            self.state = State::Key { first: false };
            return Ok(RowStep::Moved);
        }
        if !first {
            if byte != b',' {
                return Err(malformed("expected `,` or `]` between rows"));
            }
            match self.peek_from(at + 1) {
                Some(next) => (byte, at) = next,
                None => return self.need_more().map(|_| RowStep::NeedMore),
            }
        }
        if byte != b'[' {
            self.position.row.set(self.rows);
            return Err(self.row_error(&serde::de::Error::custom(
                "invalid type: expected a row (an array of cells)",
            )));
        }
        let columns = self.columns.as_deref().unwrap_or_default();
        self.position.row.set(self.rows);
        self.position.column.set(None);
        let slice = &self.buf[at..];
        let mut de = serde_json::Deserializer::from_slice(slice);
        match RowSeed::<T>::new(&self.position, columns).deserialize(&mut de) {
            Ok(row) => {
                let used = de.into_iter::<IgnoredAny>().byte_offset();
                sink(row);
                self.pos = at + used;
                self.state = State::Rows { first: false };
                Ok(RowStep::Row)
            }
            Err(err) if !self.eof && (err.is_eof() || !complete_value(slice)) => {
                Ok(RowStep::NeedMore)
            }
            Err(err) => Err(self.row_error(&err)),
        }
    }

    fn row_error(&self, err: &serde_json::Error) -> Error {
        positioned::<T>(
            err,
            &self.position,
            self.columns.as_deref().unwrap_or_default(),
        )
        .with_sent(true, false)
    }

    /// Parses one JSON value starting at `at`; a value must be followed by a byte (the body
    /// always ends with `}`), so a number cut by the buffer's end is never taken whole.
    fn parse_at<V: for<'de> Deserialize<'de>>(&self, at: usize) -> Result<Parse<V>, Error> {
        let slice = &self.buf[at..];
        let mut de = serde_json::Deserializer::from_slice(slice);
        match V::deserialize(&mut de) {
            Ok(value) => {
                let used = de.into_iter::<IgnoredAny>().byte_offset();
                if at + used >= self.buf.len() && !self.eof {
                    return Ok(Parse::NeedMore);
                }
                Ok(Parse::Value(value, at + used))
            }
            Err(err) if !self.eof && (err.is_eof() || !complete_value(slice)) => {
                Ok(Parse::NeedMore)
            }
            Err(err) => Err(Error::decode(err).with_sent(true, false)),
        }
    }
}

fn malformed(message: &str) -> Error {
    Error::new(ErrorKind::Decode {
        row: None,
        column: None,
        message: message.to_owned(),
    })
    .with_sent(true, false)
}

/// Whether `bytes` starts with a complete JSON value (after whitespace). Only asked after a
/// parse error, to tell a value cut by the buffer's end from a wrong one.
pub(crate) fn complete_value(bytes: &[u8]) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut started = false;
    for &byte in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
                if depth == 0 {
                    return true;
                }
            }
            continue;
        }
        match byte {
            b'"' => {
                in_string = true;
                started = true;
            }
            b'[' | b'{' => {
                depth += 1;
                started = true;
            }
            b']' | b'}' => {
                if depth <= 1 {
                    return true;
                }
                depth -= 1;
            }
            b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' if depth == 0 && started => return true,
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => started = true,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces<T: DeserializeOwned>(body: &[u8], cuts: &[usize]) -> Result<Vec<T>, Error> {
        let mut decoder = Decoder::<T>::new();
        let mut rows = Vec::new();
        let mut from = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(body.len());
        for cut in cuts {
            decoder.push(&body[from..cut.max(from)]);
            from = cut.max(from);
            loop {
                match decoder.next()? {
                    Step::Row(row) => rows.push(row),
                    Step::NeedMore => break,
                    Step::End => return Ok(rows),
                }
            }
        }
        decoder.finish();
        loop {
            match decoder.next()? {
                Step::Row(row) => rows.push(row),
                Step::NeedMore => unreachable!("the input is finished"),
                Step::End => return Ok(rows),
            }
        }
    }

    const BODY: &str = r#"{"columns":[{"name":"id","type":"INTEGER"},{"name":"s","type":"TEXT"},{"name":"f","type":"REAL"}],"rows":[[1,"a \"quoted\" ] , [ string",1.5e3],[-22,"\u00e9\\",-0.25],[333,"",12345678901234567]],"rows_affected":0,"last_insert_id":null}"#;

    /// The bodies these tests decode are the protocol's (its typed definitions read them too).
    #[test]
    fn the_test_bodies_are_the_protocol_s() {
        use sqlhttp_protocol::body::{QueryResult, StreamedFailure};
        let whole: QueryResult = serde_json::from_str(BODY).unwrap();
        assert_eq!(whole.rows.len(), 3);
        let failed: StreamedFailure = serde_json::from_str(
            r#"{"columns":[{"name":"n","type":""}],"rows":[[1]],"error":{"code":"SQL_ERROR","message":"m"}}"#,
        )
        .unwrap();
        assert_eq!(failed.error.code, "SQL_ERROR");
    }

    type Row = (i64, String, f64);

    #[test]
    fn byte_by_byte_decodes_the_same_rows() {
        let whole: Vec<Row> = decode_in_pieces(BODY.as_bytes(), &[]).unwrap();
        assert_eq!(whole.len(), 3);
        let cuts: Vec<usize> = (0..BODY.len()).collect();
        assert_eq!(
            decode_in_pieces::<Row>(BODY.as_bytes(), &cuts).unwrap(),
            whole
        );
    }

    #[test]
    fn an_error_member_after_the_rows_fails_after_the_rows() {
        let body = br#"{"columns":[{"name":"n","type":""}],"rows":[[1],[2]],"error":{"code":"SQL_ERROR","message":"integer overflow"}}"#;
        let mut decoder = Decoder::<i64>::new();
        decoder.push(body);
        decoder.finish();
        assert!(matches!(decoder.next().unwrap(), Step::Row(1)));
        assert!(matches!(decoder.next().unwrap(), Step::Row(2)));
        let err = decoder.next().unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Sql { message, .. } if message == "integer overflow"),
            "{err:?}"
        );
    }

    #[test]
    fn a_cut_body_is_never_a_clean_end() {
        for cut in 1..BODY.len() {
            let mut decoder = Decoder::<Row>::new();
            decoder.push(&BODY.as_bytes()[..cut]);
            decoder.finish();
            let ended = std::iter::from_fn(|| match decoder.next() {
                Ok(Step::Row(_)) => Some(None),
                Ok(Step::End) => Some(Some(true)),
                Ok(Step::NeedMore) | Err(_) => Some(Some(false)),
            })
            .flatten()
            .next()
            .unwrap();
            assert!(!ended, "cut at {cut} ended cleanly");
        }
    }

    #[test]
    fn a_bookmark_member_at_the_end_is_read_in_any_split_and_a_bad_one_ignored() {
        let body = r#"{"columns":[{"name":"n","type":""}],"rows":[[1],[2]],"rows_affected":2,"last_insert_id":7,"bookmark":"00000000016b3a28"}"#;
        for cut in 0..=body.len() {
            let mut decoder = Decoder::<i64>::new();
            let mut rows = Vec::new();
            for piece in [&body.as_bytes()[..cut], &body.as_bytes()[cut..]] {
                decoder.push(piece);
                while let Step::Row(row) = decoder.next().unwrap() {
                    rows.push(row);
                }
            }
            decoder.finish();
            assert!(matches!(decoder.next().unwrap(), Step::End), "cut at {cut}");
            assert_eq!(rows, [1, 2]);
            assert_eq!(
                decoder.bookmark().map(|b| b.to_string()).as_deref(),
                Some("00000000016b3a28"),
                "cut at {cut}"
            );
            assert_eq!(decoder.effect().last_insert_id, Some(7));
        }
        for bad in [
            r#""16b3a28""#,
            r#""00000000016B3A2G""#,
            "null",
            "12",
            r#"{"lsn":"0/16B3A28"}"#,
            r#"["00000000016b3a28"]"#,
        ] {
            let body = format!(
                r#"{{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":null,"bookmark":{bad}}}"#
            );
            let mut decoder = Decoder::<i64>::whole(body.as_bytes());
            assert!(matches!(decoder.next().unwrap(), Step::End), "{bad}");
            assert_eq!(decoder.bookmark(), None, "{bad}");
            assert_eq!(decoder.effect().rows_affected, Some(1), "{bad}");
        }
    }

    /// The `stats` a success body ends with (after `bookmark`) is read in any split, and a body
    /// without it (an older server's) reads as before.
    #[test]
    fn a_stats_member_at_the_end_is_read_in_any_split() {
        let body = r#"{"columns":[{"name":"n","type":""}],"rows":[[1],[2]],"rows_affected":0,"last_insert_id":null,"bookmark":"00000000016b3a28","stats":{"duration_ms":0.25,"rows_read":2,"rows_written":0,"served_by":"primary","later":[1]}}"#;
        for cut in 0..=body.len() {
            let mut decoder = Decoder::<(i64,)>::new();
            decoder.push(&body.as_bytes()[..cut]);
            decoder.push(&body.as_bytes()[cut..]);
            decoder.finish();
            let mut rows = Vec::new();
            assert!(matches!(decoder.drain_into(&mut rows).unwrap(), Step::End));
            assert_eq!(rows, [(1,), (2,)]);
            let stats = decoder.stats().unwrap();
            assert_eq!(stats.duration, Some(std::time::Duration::from_micros(250)));
            assert_eq!((stats.rows_read, stats.rows_written), (Some(2), Some(0)));
            assert!(decoder.bookmark().is_some());
        }
        let older = r#"{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":null}"#;
        let mut decoder = Decoder::<(i64,)>::whole(older.as_bytes());
        assert!(matches!(decoder.next().unwrap(), Step::End));
        assert_eq!(decoder.stats(), None);
        let odd =
            r#"{"columns":[],"rows":[],"rows_affected":1,"last_insert_id":null,"stats":"fast"}"#;
        let mut decoder = Decoder::<(i64,)>::whole(odd.as_bytes());
        assert!(matches!(decoder.next().unwrap(), Step::End));
        assert_eq!(decoder.stats(), None);
    }

    #[test]
    fn complete_values() {
        assert!(complete_value(b"  [1,\"]\",[2]] x"));
        assert!(!complete_value(b"[1,\"]\",[2]"));
        assert!(complete_value(b"12,"));
        assert!(!complete_value(b"12"));
        assert!(!complete_value(b"1e"));
        assert!(complete_value(b"\"a\\\"\" "));
        assert!(!complete_value(b"\"a\\\""));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Any split of the body into pieces decodes the same rows.
        #[test]
        fn any_split_decodes_the_same_rows(cuts in proptest::collection::vec(0usize..10_000, 0..12)) {
            let whole: Vec<Row> = decode_in_pieces(BODY.as_bytes(), &[]).unwrap();
            let split: Vec<Row> = decode_in_pieces(BODY.as_bytes(), &cuts).unwrap();
            proptest::prop_assert_eq!(split, whole);
        }
    }
}
