//! One logged-in PostgreSQL session over a stream the caller opened (TCP, a Unix socket, or TLS
//! already negotiated): the startup message, authentication (trust, cleartext, MD5,
//! SCRAM-SHA-256), the backend's key for cancel requests, and the one reader of the backend's
//! messages, which checks each message's declared length against [`Limits`] as its header
//! arrives, before any of its body is read.
//!
//! A message longer than [`READ_CHUNK`] (a large row, a long error) makes the read buffer grow
//! to hold it, and a large parameter the write buffer. A pooled connection lives for hours, so
//! neither keeps that size: the read buffer starts afresh once such a message was handed over
//! (the message keeps its own bytes for as long as its holder wants them), the write buffer once
//! its flight was sent.
//!
//! Knows the protocol's framing and login; what a flight of statements is lives in `flight`.

use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::backend::{Message, ParameterStatusBody};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{DbError, Error};

/// The most the reader asks the socket for at once; a long message's buffer grows by what
/// arrives, so a header alone never makes the connection hold the length it declares.
const READ_CHUNK: usize = 64 * 1024;

/// The most run-time parameters a connection keeps by name ([`Connection::parameter`]).
/// PostgreSQL reports a fixed set of about twenty; a backend that reports new names without end
/// does not make a pooled connection grow with them.
const MAX_PARAMETERS: usize = 64;

/// What each buffer starts with, and starts again with after a message past [`READ_CHUNK`].
const FIRST_CAPACITY: usize = 8 * 1024;

/// The most one backend message may declare, checked against its header before its body is
/// read (a `DataRow` is one message: this bounds a row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes, the message's type byte and length included.
    pub max_message: usize,
}

impl Default for Limits {
    /// 64 MiB: a row of that size is far past what a client of the server may read.
    fn default() -> Self {
        Limits {
            max_message: 64 << 20,
        }
    }
}

/// What the connection logs in as.
#[derive(Debug, Clone, Default)]
pub struct Startup<'a> {
    /// The role.
    pub user: &'a str,
    /// The database; PostgreSQL takes the role's name when `None`.
    pub database: Option<&'a str>,
    /// The password, asked for only by the server's `pg_hba.conf`.
    pub password: Option<&'a [u8]>,
    /// Shown in `pg_stat_activity`.
    pub application_name: Option<&'a str>,
    /// Log in only by SCRAM-SHA-256, as libpq's `require_auth=scram-sha-256`: a server (or
    /// whatever stands in the middle of an unverified link) that asks for the password in
    /// cleartext or as MD5, or lets the session in without asking, is refused before anything of
    /// the password is sent.
    pub require_scram: bool,
}

/// The backend's process id and secret, which a cancel request names (see [`crate::cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackendKey {
    /// The backend's process id.
    pub process_id: i32,
    /// The secret a cancel request must carry.
    pub secret_key: i32,
}

/// The transaction state a `ReadyForQuery` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStatus {
    /// `I`: no transaction open.
    Idle,
    /// `T`: in a transaction block.
    InTransaction,
    /// `E`: in a failed transaction block; only its end is accepted.
    Failed,
}

impl TransactionStatus {
    pub(crate) fn from_byte(byte: u8) -> Result<TransactionStatus, Error> {
        match byte {
            b'I' => Ok(TransactionStatus::Idle),
            b'T' => Ok(TransactionStatus::InTransaction),
            b'E' => Ok(TransactionStatus::Failed),
            other => Err(Error::Protocol(format!(
                "ReadyForQuery with status {:?}",
                char::from(other)
            ))),
        }
    }
}

/// Where a `DataRow` refused from its header ([`Error::TooLarge`]) first passes a bound (see
/// [`crate::Answers::row_past_bounds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowPast {
    /// Cell `index` (from 0) declared `bytes`, more than the cell bound.
    Cell {
        /// The cell's column, from 0.
        index: usize,
        /// The length it declared.
        bytes: usize,
    },
    /// Its cells passed the row bound before any one passed the cell bound.
    Row,
}

/// A logged-in session. Its requests are flights (`Connection::flight`); between flights it is
/// either clean ([`Connection::is_clean`]) or in doubt, and a connection in doubt is dropped.
#[derive(Debug)]
pub struct Connection<S> {
    stream: S,
    pub(crate) read: BytesMut,
    pub(crate) write: BytesMut,
    limits: Limits,
    key: BackendKey,
    parameters: Vec<(String, String)>,
    pub(crate) status: TransactionStatus,
    pub(crate) in_doubt: bool,
    /// A message past [`READ_CHUNK`] was handed over: the read buffer, which may share its
    /// allocation, starts afresh before the next message (see [`Connection::read_message`]).
    grown: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Logs in over `stream` and waits for the first `ReadyForQuery`. PostgreSQL's refusal of
    /// the login (a wrong password, an unknown role or database, too many connections) is
    /// [`Error::Fatal`]: it ends the session.
    pub async fn startup(
        stream: S,
        startup: &Startup<'_>,
        limits: Limits,
    ) -> Result<Connection<S>, Error> {
        let mut connection = Connection::over(stream, limits, true);
        let mut parameters = vec![("user", startup.user), ("client_encoding", "UTF8")];
        if let Some(database) = startup.database {
            parameters.push(("database", database));
        }
        if let Some(name) = startup.application_name {
            parameters.push(("application_name", name));
        }
        frontend::startup_message(parameters, &mut connection.write)
            .map_err(|e| Error::unencodable(&e))?;
        connection.send().await?;
        connection.authenticate(startup).await?;
        loop {
            match connection.message().await? {
                Message::BackendKeyData(body) => {
                    connection.key = BackendKey {
                        process_id: body.process_id(),
                        secret_key: body.secret_key(),
                    };
                }
                Message::ParameterStatus(body) => connection.parameter_status(&body)?,
                Message::NoticeResponse(_) => {}
                Message::ErrorResponse(body) => {
                    return Err(Error::Fatal(Box::new(DbError::parse(&body)?)));
                }
                Message::ReadyForQuery(body) => {
                    connection.status = TransactionStatus::from_byte(body.status())?;
                    connection.in_doubt = false;
                    return Ok(connection);
                }
                _ => return Err(unexpected("after authentication")),
            }
        }
    }

    /// Answers the server's authentication requests until `AuthenticationOk`.
    async fn authenticate(&mut self, startup: &Startup<'_>) -> Result<(), Error> {
        let weak = |method: &str| {
            if startup.require_scram {
                Err(Error::Authentication(format!(
                    "the server asks for {method} and only SCRAM-SHA-256 is allowed"
                )))
            } else {
                Ok(())
            }
        };
        let mut scram_done = false;
        let password = || {
            startup.password.ok_or_else(|| {
                Error::Authentication("the server asks for a password and none was given".into())
            })
        };
        loop {
            match self.message().await? {
                Message::AuthenticationOk => {
                    if !scram_done {
                        weak("no authentication")?;
                    }
                    return Ok(());
                }
                Message::AuthenticationCleartextPassword => {
                    weak("the password in cleartext")?;
                    frontend::password_message(password()?, &mut self.write)
                        .map_err(|e| Error::unencodable(&e))?;
                    self.send().await?;
                }
                Message::AuthenticationMd5Password(body) => {
                    weak("an MD5 password hash")?;
                    let hash = md5_hash(startup.user.as_bytes(), password()?, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.write)
                        .map_err(|e| Error::unencodable(&e))?;
                    self.send().await?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut scram_offered = false;
                    while let Some(mechanism) =
                        mechanisms.next().map_err(|e| Error::malformed(&e))?
                    {
                        scram_offered |= mechanism == SCRAM_SHA_256;
                    }
                    if !scram_offered {
                        return Err(Error::Authentication(
                            "the server offers no SASL mechanism this connection speaks (SCRAM-SHA-256)".into(),
                        ));
                    }
                    self.scram(password()?).await?;
                    scram_done = true;
                }
                Message::ErrorResponse(body) => {
                    return Err(Error::Fatal(Box::new(DbError::parse(&body)?)));
                }
                Message::NoticeResponse(_) => {}
                Message::AuthenticationGss
                | Message::AuthenticationGssContinue(_)
                | Message::AuthenticationKerberosV5
                | Message::AuthenticationScmCredential
                | Message::AuthenticationSspi => {
                    return Err(Error::Authentication(
                        "the server asks for a method this connection does not speak \
                         (GSSAPI, SSPI, Kerberos or SCM credentials)"
                            .into(),
                    ));
                }
                _ => return Err(unexpected("during authentication")),
            }
        }
    }

    /// SCRAM-SHA-256 without channel binding (the stream may be TLS the caller negotiated; the
    /// server's certificate was checked there).
    async fn scram(&mut self, password: &[u8]) -> Result<(), Error> {
        let mut scram = ScramSha256::new(password, ChannelBinding::unsupported());
        frontend::sasl_initial_response(SCRAM_SHA_256, scram.message(), &mut self.write)
            .map_err(|e| Error::unencodable(&e))?;
        self.send().await?;
        match self.message().await? {
            Message::AuthenticationSaslContinue(body) => {
                scram.update(body.data()).map_err(|e| scram_failed(&e))?;
            }
            Message::ErrorResponse(body) => {
                return Err(Error::Fatal(Box::new(DbError::parse(&body)?)));
            }
            _ => return Err(unexpected("in SCRAM's first exchange")),
        }
        frontend::sasl_response(scram.message(), &mut self.write)
            .map_err(|e| Error::unencodable(&e))?;
        self.send().await?;
        match self.message().await? {
            // Checks the server's signature: a server that does not know the password fails here.
            Message::AuthenticationSaslFinal(body) => {
                scram.finish(body.data()).map_err(|e| scram_failed(&e))?;
            }
            Message::ErrorResponse(body) => {
                return Err(Error::Fatal(Box::new(DbError::parse(&body)?)));
            }
            _ => return Err(unexpected("in SCRAM's final exchange")),
        }
        Ok(())
    }

    /// Keeps a run-time parameter the server reported, at login or after a `SET` of one that it
    /// reports; past [`MAX_PARAMETERS`] names, a new one is passed over (those kept still
    /// change).
    pub(crate) fn parameter_status(&mut self, body: &ParameterStatusBody) -> Result<(), Error> {
        let name = body.name().map_err(|e| Error::malformed(&e))?;
        let value = body.value().map_err(|e| Error::malformed(&e))?.to_owned();
        let full = self.parameters.len() >= MAX_PARAMETERS;
        match self.parameters.iter_mut().find(|(known, _)| known == name) {
            Some((_, known)) => *known = value,
            None if !full => self.parameters.push((name.to_owned(), value)),
            None => {}
        }
        Ok(())
    }

    /// A session another driver logged in over `stream` and handed over between its requests,
    /// with no answer of its owed (the driver read each of its requests to its
    /// `ReadyForQuery`, and no transaction is open): its flights go on where the driver's
    /// requests left off. The session's key and run-time parameters are not known here (a
    /// cancel request goes through the driver that logged in); `limits` bound its messages
    /// from here on.
    pub fn resume(stream: S, limits: Limits) -> Connection<S> {
        Connection::over(stream, limits, false)
    }

    /// A connection over `stream` with nothing read or written yet, idle; `in_doubt` until its
    /// first `ReadyForQuery` when it has yet to log in.
    fn over(stream: S, limits: Limits, in_doubt: bool) -> Connection<S> {
        Connection {
            stream,
            read: BytesMut::with_capacity(FIRST_CAPACITY),
            write: BytesMut::with_capacity(FIRST_CAPACITY),
            limits,
            key: BackendKey::default(),
            parameters: Vec::new(),
            status: TransactionStatus::Idle,
            in_doubt,
            grown: false,
        }
    }

    /// The key a cancel request for this session names.
    pub fn backend_key(&self) -> BackendKey {
        self.key
    }

    /// A run-time parameter the server reported (`server_version`, `TimeZone`, ...); the first
    /// 64 names reported are kept, which is more than PostgreSQL reports.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters
            .iter()
            .find(|(known, _)| known == name)
            .map(|(_, value)| value.as_str())
    }

    /// The transaction state the last `ReadyForQuery` reported.
    pub fn transaction_status(&self) -> TransactionStatus {
        self.status
    }

    /// Whether the session may serve another request as it is: every flight's answers were read
    /// to their last `ReadyForQuery`, nothing failed on the socket, and no transaction is open.
    pub fn is_clean(&self) -> bool {
        !self.in_doubt && self.status == TransactionStatus::Idle
    }

    /// Whether the session is in doubt: a flight's answers were left unread, the backend sent
    /// more than a flight asked for, PostgreSQL ended the session, or the socket or the protocol
    /// failed. Such a session can only be dropped.
    pub fn is_in_doubt(&self) -> bool {
        self.in_doubt
    }

    /// The bytes the connection's read and write buffers hold allocated for the messages to
    /// come. Meant for tests (and a pool's metrics): it stays near its usual size (under
    /// 256 KiB) between flights however large a message the connection carried, so a pooled
    /// connection does not keep the largest row or parameter it ever saw.
    pub fn buffer_capacity(&self) -> usize {
        self.read.capacity() + self.write.capacity()
    }

    /// Writes and flushes what was encoded into the write buffer.
    pub(crate) async fn send(&mut self) -> Result<(), Error> {
        let sent = async {
            self.stream.write_all(&self.write).await?;
            self.stream.flush().await
        }
        .await;
        self.clear_write();
        sent.map_err(|e| {
            self.in_doubt = true;
            Error::Io(e)
        })
    }

    /// The next backend message, its declared length checked against [`Limits`] before its body
    /// is read. Any failure here leaves the connection in doubt.
    pub(crate) async fn message(&mut self) -> Result<Message, Error> {
        match self.read_message().await {
            Ok(message) => Ok(message),
            Err(e) => {
                self.in_doubt = true;
                Err(e)
            }
        }
    }

    /// Empties the write buffer, and gives back what a large flight made it grow to.
    pub(crate) fn clear_write(&mut self) {
        if self.write.capacity() > READ_CHUNK {
            self.write = BytesMut::with_capacity(FIRST_CAPACITY);
        } else {
            self.write.clear();
        }
    }

    async fn read_message(&mut self) -> Result<Message, Error> {
        if self.grown && self.read.len() <= READ_CHUNK {
            // The large message was handed over, and what followed it is short: kept in a
            // buffer of the usual size, the large one goes as soon as its message is dropped
            // (else the buffer would take all of it back once it is, and keep it).
            let mut fresh = BytesMut::with_capacity(FIRST_CAPACITY.max(self.read.len()));
            fresh.extend_from_slice(&self.read);
            self.read = fresh;
            self.grown = false;
        }
        loop {
            if self.read.len() >= 5 {
                let tag = self.read[0];
                let length = (&self.read[1..5]).get_u32() as usize;
                if length < 4 {
                    return Err(Error::Protocol(format!(
                        "a message declared {length} bytes"
                    )));
                }
                let declared = length + 1;
                if declared > self.limits.max_message {
                    return Err(Error::TooLarge {
                        tag,
                        declared,
                        limit: self.limits.max_message,
                    });
                }
                if self.read.len() >= declared {
                    self.grown |= declared > READ_CHUNK;
                    return match Message::parse(&mut self.read).map_err(|e| Error::malformed(&e))? {
                        Some(message) => Ok(message),
                        None => Err(Error::Protocol("a whole message did not parse".into())),
                    };
                }
                // A chunk at a time: the body's bytes, as they arrive, grow the buffer (amortized),
                // and a header alone never reserves the length it declares.
                self.read
                    .reserve((declared - self.read.len()).min(READ_CHUNK));
            } else {
                self.read.reserve(READ_CHUNK);
            }
            if self.stream.read_buf(&mut self.read).await? == 0 {
                return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }

    /// After [`Error::TooLarge`] for a `DataRow` (still at the front of the read buffer): reads
    /// the row's cell lengths as they arrive, passing over the cells between them without
    /// holding them, until a cell declares more than `max_cell` bytes or the row's cells (with
    /// their length fields) pass `max_row`. The connection stays in doubt.
    pub(crate) async fn row_past_bounds(
        &mut self,
        max_cell: usize,
        max_row: usize,
    ) -> Result<RowPast, Error> {
        if !self.in_doubt || self.read.first() != Some(&b'D') || self.read.len() < 5 {
            return Err(Error::Protocol("no refused row to read".into()));
        }
        self.read.advance(5);
        self.fill(2).await?;
        let cells = self.read.get_i16();
        let mut row = 0usize;
        for index in 0..usize::try_from(cells).unwrap_or(0) {
            self.fill(4).await?;
            let Ok(bytes) = usize::try_from(self.read.get_i32()) else {
                // NULL.
                continue;
            };
            if bytes > max_cell {
                return Ok(RowPast::Cell { index, bytes });
            }
            row = row.saturating_add(4).saturating_add(bytes);
            if row > max_row {
                return Ok(RowPast::Row);
            }
            let mut left = bytes;
            while left > 0 {
                self.fill(1).await?;
                let passed = left.min(self.read.len());
                self.read.advance(passed);
                left -= passed;
            }
        }
        Ok(RowPast::Row)
    }

    /// Reads until the read buffer holds at least `bytes`.
    async fn fill(&mut self, bytes: usize) -> Result<(), Error> {
        while self.read.len() < bytes {
            self.read.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut self.read).await? == 0 {
                return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
        Ok(())
    }

    /// Ends the session politely (`Terminate`) and closes the stream. Whatever an abandoned
    /// flight left unsent is dropped first: only the `Terminate` goes out.
    pub async fn close(mut self) -> Result<(), Error> {
        self.clear_write();
        frontend::terminate(&mut self.write);
        self.send().await?;
        self.stream.shutdown().await?;
        Ok(())
    }
}

fn scram_failed(e: &std::io::Error) -> Error {
    Error::Authentication(format!("SCRAM-SHA-256 failed: {e}"))
}

fn unexpected(when: &str) -> Error {
    Error::Protocol(format!("an unexpected message {when}"))
}
