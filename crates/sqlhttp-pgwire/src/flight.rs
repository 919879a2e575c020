//! A flight: every message of one step of a request written together and sent in one write,
//! ended by as few `Sync`s as the step needs, then its answers read in order until each `Sync`'s
//! `ReadyForQuery` has arrived (ADR 0059).
//!
//! PostgreSQL runs a flight's messages in order and, after an error, skips everything up to the
//! next `Sync`: [`Answers`] hands the error over as [`Answer::Error`] and goes on reading to that
//! `ReadyForQuery`, whose [`TransactionStatus`] says what the error left (a failed transaction
//! block, or none). A flight whose answers are dropped before their last `ReadyForQuery` leaves
//! its connection in doubt.
//!
//! Knows the extended protocol's messages; nothing about what the statements mean.

use bytes::{BufMut, Bytes};
use fallible_iterator::FallibleIterator;
use postgres_protocol::IsNull;
use postgres_protocol::message::backend::{
    CommandCompleteBody, DataRowBody, Message, RowDescriptionBody,
};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::connection::{Connection, RowPast, TransactionStatus};
use crate::error::{DbError, Error};

/// A parameter's or a result column's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// PostgreSQL's text representation.
    Text,
    /// The type's binary representation.
    Binary,
}

impl Format {
    fn code(self) -> i16 {
        match self {
            Format::Text => 0,
            Format::Binary => 1,
        }
    }
}

/// One bound parameter: its format and its bytes (`None` for SQL `NULL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param<'a> {
    /// How `value` is encoded.
    pub format: Format,
    /// The encoded value, `None` for `NULL`.
    pub value: Option<&'a [u8]>,
}

impl<C: AsyncRead + AsyncWrite + Unpin> Connection<C> {
    /// Starts a flight on a connection not in doubt; one in doubt refuses it
    /// ([`Error::Invalid`], nothing sent).
    pub fn flight(&mut self) -> Result<Flight<'_, C>, Error> {
        if self.in_doubt {
            return Err(Error::Invalid("the connection is in doubt".into()));
        }
        self.clear_write();
        Ok(Flight {
            connection: self,
            syncs: 0,
            open: false,
            broken: false,
        })
    }
}

/// The messages of one flight, encoded as they are added; [`Flight::send`] writes them at once.
/// A message the caller's input cannot be encoded into (a NUL byte in a statement's text or a
/// name, more than 65 535 parameters, a message past 2 GiB) is [`Error::Invalid`], and the
/// flight is then refused at [`Flight::send`] with nothing of it sent.
#[derive(Debug)]
pub struct Flight<'c, C> {
    connection: &'c mut Connection<C>,
    syncs: usize,
    /// A message was added after the last `Sync` (or none was yet): sent, it would run with
    /// its answers after the flight's last `ReadyForQuery`, read by the next flight as its own.
    open: bool,
    /// A message failed to encode (part of it may be in the buffer): the flight is never sent.
    broken: bool,
}

impl<'c, C: AsyncRead + AsyncWrite + Unpin> Flight<'c, C> {
    /// `Parse`: prepares `sql` as the statement `name` (`""`: the unnamed one), with the given
    /// parameter type OIDs (0, or fewer than the statement has: PostgreSQL infers them).
    pub fn parse(&mut self, name: &str, sql: &str, types: &[u32]) -> Result<&mut Self, Error> {
        let encoded = frontend::parse(name, sql, types.iter().copied(), &mut self.connection.write);
        self.encoded(encoded.map_err(|e| Error::unencodable(&e)))
    }

    /// Keeps the flight sendable only while every message encoded whole.
    fn encoded(&mut self, result: Result<(), Error>) -> Result<&mut Self, Error> {
        self.open = true;
        match result {
            Ok(()) => Ok(self),
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }

    /// `Describe` of a prepared statement: answered by its parameters' types
    /// ([`Answer::ParameterDescription`]) and its result's columns ([`Answer::RowDescription`],
    /// or [`Answer::NoData`]).
    pub fn describe_statement(&mut self, name: &str) -> Result<&mut Self, Error> {
        let encoded = frontend::describe(b'S', name, &mut self.connection.write);
        self.encoded(encoded.map_err(|e| Error::unencodable(&e)))
    }

    /// `Bind`: the portal `portal` (`""`: the unnamed one) of `statement` with `params`, its
    /// result columns all in `results`' format.
    pub fn bind(
        &mut self,
        portal: &str,
        statement: &str,
        params: &[Param<'_>],
        results: Format,
    ) -> Result<&mut Self, Error> {
        let bound = frontend::bind(
            portal,
            statement,
            params.iter().map(|p| p.format.code()),
            params.iter(),
            |param, buf| match param.value {
                Some(bytes) => {
                    buf.put_slice(bytes);
                    Ok(IsNull::No)
                }
                None => Ok(IsNull::Yes),
            },
            Some(results.code()),
            &mut self.connection.write,
        );
        self.encoded(match bound {
            Ok(()) => Ok(()),
            Err(frontend::BindError::Conversion(e)) => Err(Error::Invalid(e.to_string())),
            Err(frontend::BindError::Serialization(e)) => Err(Error::unencodable(&e)),
        })
    }

    /// `Execute` of `portal`, all its rows (`max_rows` 0) or at most `max_rows` of them
    /// (then [`Answer::PortalSuspended`] when more remain).
    pub fn execute(&mut self, portal: &str, max_rows: i32) -> Result<&mut Self, Error> {
        let encoded = frontend::execute(portal, max_rows, &mut self.connection.write);
        self.encoded(encoded.map_err(|e| Error::unencodable(&e)))
    }

    /// Parse, Bind and Execute of `sql` as the unnamed statement, without parameters, its
    /// result in text: for the server's own fixed statements (`BEGIN`, `ROLLBACK`, ...).
    pub fn statement(&mut self, sql: &str) -> Result<&mut Self, Error> {
        self.parse("", sql, &[])?
            .bind("", "", &[], Format::Text)?
            .execute("", 0)
    }

    /// `Query`: `sql`, one or more statements, by the simple protocol, parsed as PostgreSQL
    /// reads a client's text: for the server's own fixed statements that no named statement may
    /// stand in for. Answered by each statement's rows (in text) and end, then a
    /// `ReadyForQuery` of its own; an error skips the rest of its statements. It must follow a
    /// `Sync` (or open the flight): after an extended-protocol error PostgreSQL discards
    /// everything up to the next `Sync`, a `Query` with it, and its `ReadyForQuery` would never
    /// come. Elsewhere it is [`Error::Invalid`], and the flight is never sent.
    pub fn query(&mut self, sql: &str) -> Result<&mut Self, Error> {
        if self.open {
            self.broken = true;
            return Err(Error::Invalid(
                "a simple Query must follow a Sync in its flight".into(),
            ));
        }
        let encoded = frontend::query(sql, &mut self.connection.write);
        self.encoded(encoded.map_err(|e| Error::unencodable(&e)))?;
        // Its own `ReadyForQuery` ends it, as a `Sync`'s does.
        self.open = false;
        self.syncs += 1;
        Ok(self)
    }

    /// `Close` of a prepared statement.
    pub fn close_statement(&mut self, name: &str) -> Result<&mut Self, Error> {
        let encoded = frontend::close(b'S', name, &mut self.connection.write);
        self.encoded(encoded.map_err(|e| Error::unencodable(&e)))
    }

    /// `Sync`: ends the messages before it (and the implicit transaction, when no `BEGIN` ran);
    /// answered by a `ReadyForQuery`, after everything before it, or after the error that
    /// skipped them.
    pub fn sync(&mut self) -> &mut Self {
        frontend::sync(&mut self.connection.write);
        self.syncs += 1;
        self.open = false;
        self
    }

    /// Writes the flight in one write and returns its answers, in order. A flight that does not
    /// end with its `Sync` (none at all, or a message after the last one), or one a message of
    /// which failed to encode, is refused ([`Error::Invalid`]) and nothing of it is sent.
    pub async fn send(self) -> Result<Answers<'c, C>, Error> {
        if self.syncs == 0 || self.open || self.broken {
            self.connection.clear_write();
            return Err(Error::Invalid(if self.broken {
                "a message of the flight failed to encode".into()
            } else {
                "a flight must end with a Sync".into()
            }));
        }
        // In doubt until the last ReadyForQuery is read (see `Answers::next`).
        self.connection.in_doubt = true;
        self.connection.send().await?;
        Ok(Answers {
            connection: self.connection,
            pending: self.syncs,
        })
    }
}

/// One answer of a flight, in the order of the messages that asked for it.
#[derive(Debug)]
pub enum Answer {
    /// A `Parse` succeeded.
    ParseComplete,
    /// A `Bind` succeeded.
    BindComplete,
    /// A `Close` succeeded.
    CloseComplete,
    /// A described statement's parameter type OIDs.
    ParameterDescription(Vec<u32>),
    /// A described statement's or portal's result columns.
    RowDescription(Columns),
    /// A described statement returns no rows.
    NoData,
    /// One row: its cells as they came, walked with [`Row::iter`].
    Row(Row),
    /// A statement completed; its command tag (`SELECT 1`, `INSERT 0 3`, ...).
    CommandComplete(Tag),
    /// An empty statement's answer.
    EmptyQuery,
    /// An `Execute` with a row limit stopped before the end.
    PortalSuspended,
    /// PostgreSQL refused a message; it skipped the rest up to the next `Sync`. (A `FATAL` or
    /// `PANIC` one ends the session and comes as [`Answers::next`]'s [`Error::Fatal`] instead.)
    /// Boxed: an answer is moved once per row, and errors are rare.
    Error(Box<DbError>),
    /// A `Sync`'s answer, with the transaction state it leaves.
    ReadyForQuery(TransactionStatus),
}

/// A completed statement's command tag (`SELECT 1`, `INSERT 0 3`, `BEGIN`, ...), borrowed from
/// the bytes it came in: no allocation per statement. Checked to be text when it arrived. Like a
/// [`Row`], it holds the read buffer it was cut from: a tag kept past its flight is better
/// copied ([`Tag::as_str`]).
pub struct Tag(CommandCompleteBody);

impl Tag {
    fn checked(body: CommandCompleteBody) -> Result<Tag, Error> {
        body.tag().map_err(|e| Error::malformed(&e))?;
        Ok(Tag(body))
    }

    /// The tag's text.
    pub fn as_str(&self) -> &str {
        // Checked when it arrived (`Tag::checked`).
        self.0.tag().unwrap_or_default()
    }
}

impl std::fmt::Debug for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tag").field(&self.as_str()).finish()
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Tag {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Tag {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A `RowDescription`'s columns, read with [`Columns::to_vec`].
pub struct Columns(RowDescriptionBody);

impl std::fmt::Debug for Columns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Columns")
            .field(&self.0.fields().count())
            .finish()
    }
}

/// One column of a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Its type's OID.
    pub type_oid: u32,
    /// The OID of the table it comes straight from, 0 when none.
    pub table_oid: u32,
    /// Its number in that table, 0 when none.
    pub column_id: i16,
    /// Its type modifier (a `varchar(n)`'s `n` + 4, ...), -1 when none.
    pub type_modifier: i32,
    /// The format its cells come in.
    pub format: Format,
}

impl Columns {
    /// The columns of `body`, once each of its fields was found whole, its name UTF-8 and its
    /// format text (0) or binary (1); one that is not is the backend's protocol error, found
    /// while the flight is read.
    fn checked(body: RowDescriptionBody) -> Result<Columns, Error> {
        let mut fields = body.fields();
        while let Some(field) = fields.next().map_err(|e| Error::malformed(&e))? {
            if !matches!(field.format(), 0 | 1) {
                return Err(Error::Protocol(format!(
                    "a column's format is {}",
                    field.format()
                )));
            }
        }
        Ok(Columns(body))
    }

    /// The columns, in order. Never an `Err`: the description was checked when it arrived.
    pub fn to_vec(&self) -> Result<Vec<Column>, Error> {
        let mut columns = Vec::new();
        let mut fields = self.0.fields();
        while let Some(field) = fields.next().map_err(|e| Error::malformed(&e))? {
            columns.push(Column {
                name: field.name().to_owned(),
                type_oid: field.type_oid(),
                table_oid: field.table_oid(),
                column_id: field.column_id(),
                type_modifier: field.type_modifier(),
                format: if field.format() == 1 {
                    Format::Binary
                } else {
                    Format::Text
                },
            });
        }
        Ok(columns)
    }
}

/// One `DataRow`, its cells borrowed from the bytes as they were read. Its framing (each cell's
/// length within the row, nothing after the last) was checked when it arrived, so walking its
/// cells ([`Row::iter`]) cannot fail and allocates nothing.
pub struct Row {
    body: DataRowBody,
    len: usize,
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("cells", &self.len)
            .field("bytes", &self.body.buffer().len())
            .finish()
    }
}

impl Row {
    /// The row of `body`, once each of its cells' lengths was found within it; a row that
    /// overruns itself, has bytes after its last cell, or has a cell length below -1 (`NULL`'s)
    /// is the backend's protocol error.
    fn checked(body: DataRowBody) -> Result<Row, Error> {
        let malformed = |what: &str| Error::Protocol(format!("a malformed DataRow: {what}"));
        let mut len = 0;
        let mut ranges = body.ranges();
        while ranges
            .next()
            .map_err(|e| malformed(&e.to_string()))?
            .is_some()
        {
            len += 1;
        }
        // `ranges` takes any negative length for `NULL`; only -1 is.
        let mut rest = body.buffer();
        for _ in 0..len {
            let Some((length, after)) = rest.split_first_chunk::<4>() else {
                return Err(malformed("a cell's length is cut short"));
            };
            let length = i32::from_be_bytes(*length);
            rest = match usize::try_from(length) {
                Ok(length) => after
                    .get(length..)
                    .ok_or_else(|| malformed("a cell overruns the row"))?,
                Err(_) if length == -1 => after,
                Err(_) => return Err(malformed(&format!("a cell's length is {length}"))),
            };
        }
        Ok(Row { body, len })
    }

    /// How many cells the row has. Not compared with its result's column count (a prepared
    /// statement's columns are the caller's to know): a row writer that pairs cells with
    /// columns checks that the two counts agree.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the row has no cells (a `SELECT` of no columns).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The cells in order, each `None` for `NULL`, borrowed from the row: a row writer walks
    /// them with no allocation.
    pub fn iter(&self) -> Cells<'_> {
        Cells {
            rest: self.body.buffer(),
            remaining: self.len,
        }
    }

    /// The cells in order, each `None` for `NULL`, collected ([`Row::iter`] without the `Vec`).
    /// Never an `Err`: the row's framing was checked when it arrived.
    pub fn cells(&self) -> Result<Vec<Option<&[u8]>>, Error> {
        Ok(self.iter().collect())
    }

    /// The row's bytes as they came after its column count (each cell's length and bytes),
    /// shared, not copied: while a row is held, so is the read buffer it was cut from, so a row
    /// kept past its flight is better copied.
    pub fn bytes(&self) -> &Bytes {
        self.body.buffer_bytes()
    }
}

impl<'r> IntoIterator for &'r Row {
    type Item = Option<&'r [u8]>;
    type IntoIter = Cells<'r>;

    fn into_iter(self) -> Cells<'r> {
        self.iter()
    }
}

/// A row's cells in order, each `None` for `NULL` ([`Row::iter`]).
#[derive(Debug, Clone)]
pub struct Cells<'r> {
    /// The cells not yet walked, each its length (4 bytes, big-endian, -1 for `NULL`) and bytes.
    rest: &'r [u8],
    remaining: usize,
}

impl<'r> Iterator for Cells<'r> {
    type Item = Option<&'r [u8]>;

    fn next(&mut self) -> Option<Option<&'r [u8]>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        // In bounds: `Row::checked` walked the same lengths. Should they not be, the walk ends.
        let cell = self
            .rest
            .split_first_chunk::<4>()
            .and_then(
                |(length, rest)| match usize::try_from(i32::from_be_bytes(*length)) {
                    Err(_) => Some((None, rest)),
                    Ok(length) => rest
                        .split_at_checked(length)
                        .map(|(cell, rest)| (Some(cell), rest)),
                },
            );
        match cell {
            Some((cell, rest)) => {
                self.rest = rest;
                Some(cell)
            }
            None => {
                self.remaining = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Cells<'_> {}

impl std::iter::FusedIterator for Cells<'_> {}

/// A sent flight's answers. Read them to the end ([`Answers::next`] returns `None` after the
/// last `ReadyForQuery`); dropped before that, they leave the connection in doubt. So does a
/// backend that sent more after the last `ReadyForQuery` than the flight asked for (seen when
/// it arrived with the answers).
#[derive(Debug)]
pub struct Answers<'c, C> {
    connection: &'c mut Connection<C>,
    pending: usize,
}

impl<C: AsyncRead + AsyncWrite + Unpin> Answers<'_, C> {
    /// The next answer, `None` once every `Sync` was answered. Notices and parameter reports
    /// are passed over. An `Err` is the connection's failure (it is in doubt): the session
    /// ended by PostgreSQL ([`Error::Fatal`], what the flight did unknown), the backend's
    /// protocol violation, or the socket's failure.
    pub async fn next(&mut self) -> Result<Option<Answer>, Error> {
        if self.pending == 0 {
            return Ok(None);
        }
        loop {
            let answer = match self.connection.message().await? {
                Message::ParseComplete => Answer::ParseComplete,
                Message::BindComplete => Answer::BindComplete,
                Message::CloseComplete => Answer::CloseComplete,
                Message::ParameterDescription(body) => Answer::ParameterDescription(
                    body.parameters()
                        .collect()
                        .map_err(|e| Error::malformed(&e))?,
                ),
                Message::RowDescription(body) => Answer::RowDescription(Columns::checked(body)?),
                Message::NoData => Answer::NoData,
                Message::DataRow(body) => Answer::Row(Row::checked(body)?),
                Message::CommandComplete(body) => Answer::CommandComplete(Tag::checked(body)?),
                Message::EmptyQueryResponse => Answer::EmptyQuery,
                Message::PortalSuspended => Answer::PortalSuspended,
                Message::ErrorResponse(body) => {
                    let error = Box::new(DbError::parse(&body)?);
                    if error.ends_the_session() {
                        // FATAL or PANIC: the backend is gone, whatever the flight had done (a
                        // COMMIT may have committed): the connection's failure, not an answer.
                        self.connection.in_doubt = true;
                        return Err(Error::Fatal(error));
                    }
                    Answer::Error(error)
                }
                Message::ReadyForQuery(body) => {
                    let status = TransactionStatus::from_byte(body.status())?;
                    self.connection.status = status;
                    self.pending -= 1;
                    if self.pending == 0 {
                        // Bytes after the last ReadyForQuery are no answer of this flight: read
                        // by the next one as its own, they would put every later flight out of
                        // step. PostgreSQL sends none (but for a notification to a session that
                        // listens, which the server's sessions don't).
                        self.connection.in_doubt = !self.connection.read.is_empty();
                    }
                    Answer::ReadyForQuery(status)
                }
                Message::ParameterStatus(body) => {
                    self.connection.parameter_status(&body)?;
                    continue;
                }
                Message::NoticeResponse(_) | Message::NotificationResponse(_) => continue,
                _ => {
                    self.connection.in_doubt = true;
                    return Err(Error::Protocol(
                        "an unexpected message in a flight's answers".into(),
                    ));
                }
            };
            return Ok(Some(answer));
        }
    }

    /// After [`Error::TooLarge`] for a `DataRow` (an answer refused from its header): where the
    /// row first passes `max_cell` bytes in a cell or `max_row` bytes in all, read from its
    /// cells' lengths as they arrive, the cells between them passed over and never held (at most
    /// `max_row` bytes are read). The connection stays in doubt, its answers unread.
    pub async fn row_past_bounds(
        &mut self,
        max_cell: usize,
        max_row: usize,
    ) -> Result<RowPast, Error> {
        self.connection.row_past_bounds(max_cell, max_row).await
    }

    /// Reads the rest of the answers, keeping only the first error, for a flight whose answers
    /// don't matter past whether it succeeded (a rollback and reset). A statement's refusal is
    /// [`Error::Db`] once the flight was read to its end (the connection is not in doubt); an
    /// error that ended the session is [`Error::Fatal`] (in doubt, and a `COMMIT`'s outcome
    /// unknown).
    pub async fn finish(mut self) -> Result<TransactionStatus, Error> {
        let mut first_error = None;
        while let Some(answer) = self.next().await? {
            if let Answer::Error(e) = answer {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(Error::Db(e)),
            None => Ok(self.connection.status),
        }
    }
}
