//! The client role's connections under tokio-postgres: a socket the server opens itself (TCP or
//! a Unix socket, as the `tokio_postgres::Config` says) and a stream over it that reads the
//! backend's message framing (a type byte, then a 4-byte big-endian length that counts itself)
//! and fails the connection as soon as a message declares more than the server will take
//! (issue 27, finding 4; ADR 0028).
//!
//! tokio-postgres hands over a row only once all of it has arrived and sets no bound on a
//! message (PostgreSQL sends up to 1 GB): refused after arrival, a 200 MB cell had cost the
//! server its size. Here a `DataRow` is cut when one of its cells declares more than
//! `max(--max-value-bytes, --max-result-bytes)` plus [`SLACK`] (the store's replayed bodies
//! are cells of up to a result's size), or when the row passes `--max-result-bytes` plus
//! [`SLACK`]; any other message (a `RowDescription` of a wide result, a `NOTICE` or `ERROR`
//! text) when it passes the row's bound. What was cut is kept in [`Cuts`] under the session's
//! backend process id (read from `BackendKeyData` as it passes), for the lease to answer with
//! what the row writer would have said; the connection is gone, and its read buffer with it.
//!
//! TLS is `tls`'s: it asks for it on the socket and runs the handshake before the driver sees
//! the stream, and tokio-postgres runs with `sslmode=disable` over what it is handed (a
//! [`Socket::Tls`] or a plain one), so every byte from the backend, from the first
//! authentication request on, is framed here decrypted. [`Target`] carries both settings to
//! every connection the server opens: the pool's, the set-up's, the reaper's, cancel requests.
//!
//! Knows nothing about requests, HTTP or the answers' wording (see `run`).
//!
//! Past 600 lines on purpose for now: `engine/postgres/` is rebuilt on `sqlhttp-pgwire` by issue 38
//! (ADR 0059), which splits it by concern; issue 39 left this folder as it is.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use deadpool_postgres::Connect;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::{CancelToken, Client, Config, NoTls};

use super::tls::{Negotiated, PgTls};

/// Where and how to log in: the driver's settings (with `sslmode=disable`: TLS is done here)
/// and the URL's TLS settings.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) config: Config,
    pub(crate) tls: Arc<PgTls>,
}

/// Room above `--max-result-bytes` for what is not a cell's bytes: a row's framing (6 bytes and
/// 4 per column, up to PostgreSQL's 1,664 columns), a stored outcome's other columns, a
/// `RowDescription`'s column names.
pub(crate) const SLACK: usize = 1024 * 1024;

/// How large a message from the backend may be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// A `DataRow`'s bytes after its length field, and any other message's.
    pub(crate) message: usize,
    /// One cell of a `DataRow`.
    pub(crate) cell: usize,
}

impl Bounds {
    /// The bounds for a server's `--max-value-bytes` and `--max-result-bytes`.
    pub(crate) fn new(max_value_bytes: usize, max_result_bytes: usize) -> Bounds {
        Bounds {
            message: max_result_bytes.saturating_add(SLACK),
            cell: max_value_bytes.max(max_result_bytes).saturating_add(SLACK),
        }
    }
}

/// What a connection was cut for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Cell `column` (from 0) of row `row` (from 1) of the statement's result declared `bytes`.
    Cell {
        column: usize,
        row: u64,
        bytes: usize,
    },
    /// Row `row` (from 1) declared `bytes` after its length field, and passed the bound before
    /// any of its cells did.
    Row { row: u64, bytes: usize },
    /// A message of type `kind` that is not a row declared `bytes`.
    Message { kind: u8, bytes: usize },
}

/// What each connection was cut for, by its backend's process id.
#[derive(Debug, Default)]
pub(crate) struct Cuts {
    by_backend: Mutex<HashMap<i32, Arc<Mutex<Option<Cut>>>>>,
    /// Each live connection's [`Wire`], for its flights (taken once, when the pool learns the
    /// connection: see `lease::Backends`); `None` when two new connections named the same
    /// backend process (two servers of a multi-host URL): neither gets one.
    wires: Mutex<HashMap<i32, Option<std::sync::Weak<Wire>>>>,
}

impl Cuts {
    /// What the connection of backend `pid` was cut for, once: the entry of a cut connection
    /// goes. A connection that was not cut keeps its entry: the lease asks on every error (a
    /// division by zero as well), and the connection may serve many more requests, one of
    /// which it may yet be cut for.
    pub(crate) fn take(&self, pid: i32) -> Option<Cut> {
        let mut by_backend = self
            .by_backend
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let cut = *by_backend
            .get(&pid)?
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cut.is_some() {
            by_backend.remove(&pid);
        }
        cut
    }

    fn register(&self, pid: i32, slot: &Arc<Mutex<Option<Cut>>>) {
        let replaced = self
            .by_backend
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(pid, Arc::clone(slot));
        // Another live connection named the same backend process (two servers of a multi-host
        // URL): neither may be found by it, so neither gets flights.
        if replaced.is_some_and(|other| Arc::strong_count(&other) > 1) {
            self.wires
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(pid, None);
        }
    }

    fn keep_wire(&self, pid: i32, wire: &Arc<Wire>) {
        let mut wires = self.wires.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = wires
            .get(&pid)
            .is_some_and(|known| known.as_ref().is_none_or(|w| w.strong_count() > 0));
        wires.insert(pid, (!taken).then(|| Arc::downgrade(wire)));
    }

    /// The [`Wire`] of the live connection of backend `pid`, once.
    pub(crate) fn take_wire(&self, pid: i32) -> Option<Arc<Wire>> {
        self.wires
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&pid)??
            .upgrade()
    }

    fn forget_wire(&self, pid: i32) {
        self.wires
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&pid);
    }

    /// The connection of `pid` ended: its entry goes unless it was cut (the lease takes that).
    fn forget_uncut(&self, pid: i32) {
        let mut map = self
            .by_backend
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.get(&pid).is_some_and(|slot| {
            slot.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none()
        }) {
            map.remove(&pid);
        }
    }
}

/// Where the reader is in the backend's messages.
#[derive(Debug, Clone, Copy)]
enum State {
    /// `got` bytes of a message's 5-byte header read.
    Header { got: usize },
    /// In a message's body, `left` bytes to go.
    Body { kind: u8, left: usize },
}

/// Where the reader is in a `DataRow`'s body.
#[derive(Debug, Clone, Copy)]
enum Row {
    /// Reading the 2-byte column count.
    Count,
    /// Reading the 4-byte length of cell `column`.
    Length { column: usize },
    /// Skipping `left` bytes of cell `column`'s value.
    Value { column: usize, left: usize },
}

/// The framing reader: fed every byte the backend sends, in order.
#[derive(Debug)]
struct Framing {
    bounds: Bounds,
    state: State,
    header: [u8; 5],
    /// A fixed-size field being read (a row's count or a cell's length, `BackendKeyData`).
    field: [u8; 4],
    field_got: usize,
    row: Row,
    /// Bytes of the current `DataRow`'s body read so far, and how many it declared.
    row_read: usize,
    row_declared: usize,
    /// `DataRow`s since the last `BindComplete`, `RowDescription` or `CommandComplete`.
    rows: u64,
    /// The backend's process id, once `BackendKeyData` passed.
    pid: Option<i32>,
    /// `ReadyForQuery` messages read.
    ready: u64,
}

impl Framing {
    fn new(bounds: Bounds) -> Framing {
        Framing {
            bounds,
            state: State::Header { got: 0 },
            header: [0; 5],
            field: [0; 4],
            field_got: 0,
            row: Row::Count,
            row_read: 0,
            row_declared: 0,
            rows: 0,
            pid: None,
            ready: 0,
        }
    }

    /// Reads `bytes`; the first bound they pass is the error.
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), Cut> {
        while !bytes.is_empty() {
            match self.state {
                State::Header { got } => {
                    let take = (5 - got).min(bytes.len());
                    self.header[got..got + take].copy_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if got + take < 5 {
                        self.state = State::Header { got: got + take };
                        continue;
                    }
                    let kind = self.header[0];
                    let length = u32::from_be_bytes([
                        self.header[1],
                        self.header[2],
                        self.header[3],
                        self.header[4],
                    ]);
                    // A length under 4 is the driver's protocol error to report, not ours.
                    let left = usize::try_from(length.saturating_sub(4)).unwrap_or(usize::MAX);
                    self.start(kind, left)?;
                }
                State::Body { kind, left } => {
                    let take = left.min(bytes.len());
                    let (now, rest) = bytes.split_at(take);
                    bytes = rest;
                    match kind {
                        b'D' => self.scan_row(now)?,
                        b'K' => self.scan_key(now),
                        // Counted once whole: its status byte is what the driver waits for.
                        b'Z' if take == left => self.ready += 1,
                        _ => {}
                    }
                    self.state = if take == left {
                        State::Header { got: 0 }
                    } else {
                        State::Body {
                            kind,
                            left: left - take,
                        }
                    };
                }
            }
        }
        Ok(())
    }

    /// A message of `kind` with `left` bytes of body begins.
    fn start(&mut self, kind: u8, left: usize) -> Result<(), Cut> {
        match kind {
            b'D' => {
                self.rows += 1;
                self.row = Row::Count;
                self.row_read = 0;
                self.row_declared = left;
                self.field_got = 0;
            }
            // BindComplete, RowDescription, CommandComplete: the next row is a result's first.
            b'2' | b'T' | b'C' => self.rows = 0,
            b'K' => self.field_got = 0,
            _ => {}
        }
        if kind != b'D' && left > self.bounds.message {
            return Err(Cut::Message { kind, bytes: left });
        }
        self.state = if left == 0 {
            State::Header { got: 0 }
        } else {
            State::Body { kind, left }
        };
        Ok(())
    }

    fn scan_key(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if self.field_got < 4 {
                self.field[self.field_got] = byte;
                self.field_got += 1;
                if self.field_got == 4 {
                    self.pid = Some(i32::from_be_bytes(self.field));
                }
            }
        }
    }

    /// Part of a `DataRow`'s body: cut on a cell's declared length, or once the row's bytes
    /// pass the bound.
    fn scan_row(&mut self, bytes: &[u8]) -> Result<(), Cut> {
        // The bytes up to the bound are read for cell lengths, however the reads split them.
        let room = self.bounds.message.saturating_sub(self.row_read);
        let within = &bytes[..bytes.len().min(room)];
        self.row_read = self.row_read.saturating_add(within.len());
        self.scan_cells(within)?;
        if bytes.len() > room {
            return Err(Cut::Row {
                row: self.rows,
                bytes: self.row_declared,
            });
        }
        Ok(())
    }

    fn scan_cells(&mut self, mut bytes: &[u8]) -> Result<(), Cut> {
        while !bytes.is_empty() {
            match self.row {
                Row::Count | Row::Length { .. } => {
                    let size = if matches!(self.row, Row::Count) { 2 } else { 4 };
                    let take = (size - self.field_got).min(bytes.len());
                    self.field[self.field_got..self.field_got + take]
                        .copy_from_slice(&bytes[..take]);
                    self.field_got += take;
                    bytes = &bytes[take..];
                    if self.field_got < size {
                        continue;
                    }
                    self.field_got = 0;
                    self.row = match self.row {
                        Row::Count => Row::Length { column: 0 },
                        Row::Length { column } => {
                            // -1 is NULL: no value follows.
                            let length = i32::from_be_bytes(self.field);
                            let left = usize::try_from(length).unwrap_or(0);
                            if left > self.bounds.cell {
                                return Err(Cut::Cell {
                                    column,
                                    row: self.rows,
                                    bytes: left,
                                });
                            }
                            if left == 0 {
                                Row::Length { column: column + 1 }
                            } else {
                                Row::Value { column, left }
                            }
                        }
                        Row::Value { .. } => unreachable!("matched above"),
                    };
                }
                Row::Value { column, left } => {
                    let take = left.min(bytes.len());
                    bytes = &bytes[take..];
                    self.row = if take == left {
                        Row::Length { column: column + 1 }
                    } else {
                        Row::Value {
                            column,
                            left: left - take,
                        }
                    };
                }
            }
        }
        Ok(())
    }
}

/// A socket to PostgreSQL.
#[derive(Debug)]
pub(crate) enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
    /// TCP under TLS (see `tls`).
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
            Socket::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(unix)]
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl Socket {
    /// Makes `reader` the task the socket wakes when bytes arrive, unless bytes may be waiting
    /// already (then whoever reads next finds them without a wake). A flight takes the
    /// socket's readiness over this way as it takes the socket, before it writes: left to the
    /// driver's task, the answer that arrives while the flight's write is still returning
    /// woke the driver, which then waited for the wire's lock the flight held, and was woken
    /// once more when the flight gave the socket back (two wake-ups and a contended lock per
    /// request, in the gateway bench's profile).
    fn claim_reader(&mut self, reader: &Waker) {
        let mut cx = Context::from_waker(reader);
        // `Ready` registers nothing: the bytes are there for the flight's first read.
        let _ready = match self {
            Socket::Tcp(s) => s.poll_read_ready(&mut cx),
            #[cfg(unix)]
            Socket::Unix(s) => s.poll_read_ready(&mut cx),
            Socket::Tls(s) => s.get_ref().0.poll_read_ready(&mut cx),
        };
    }

    /// Makes `reader` the task the socket wakes when bytes arrive, without waking it: true when
    /// that was done (nothing is waiting to be read), false when it must be woken to read. Only
    /// plain TCP can tell: a peek that finds nothing registers `reader` for the next bytes; a
    /// Unix socket has no peek, and TLS may hold decrypted bytes, so those are woken.
    fn rearm_reader(&mut self, reader: &Waker) -> bool {
        let Socket::Tcp(stream) = self else {
            return false;
        };
        let mut byte = [0_u8; 1];
        let mut peeked = ReadBuf::new(&mut byte);
        stream
            .poll_peek(&mut Context::from_waker(reader), &mut peeked)
            .is_pending()
    }
}

/// What the driver wrote, framed as the backend reads it, so a flight is never written into
/// the middle of a driver's message nor reads an answer the driver is owed: how far into a
/// message it is, and how many `ReadyForQuery` the backend owes it (one for the login, one per
/// `Sync` and per simple `Query`; a statement the driver closes when its handle drops is a
/// `Close` and a `Sync` whose answer nobody waits for).
#[derive(Debug, Default)]
struct Sent {
    /// The first message (the startup message) has no type byte.
    started: bool,
    /// Bytes of the current message's header read, and the header.
    got: usize,
    header: [u8; 5],
    /// Bytes of the current message's body to go.
    left: usize,
    /// `ReadyForQuery` messages the backend owes for what was written.
    owed: u64,
    /// An extended-protocol request is open: a `Parse`, `Bind`, `Execute`, `Describe`, `Close`
    /// or `Flush` was written and its `Sync` not yet.
    open: bool,
    /// Messages written (the startup message included).
    messages: u64,
}

impl Sent {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let take = self.left.min(bytes.len());
                self.left -= take;
                bytes = &bytes[take..];
                continue;
            }
            let size = if self.started { 5 } else { 4 };
            let take = (size - self.got).min(bytes.len());
            self.header[self.got..self.got + take].copy_from_slice(&bytes[..take]);
            self.got += take;
            bytes = &bytes[take..];
            if self.got < size {
                continue;
            }
            let length = &self.header[size - 4..size];
            let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]);
            self.left = usize::try_from(length.saturating_sub(4)).unwrap_or(usize::MAX);
            let kind = if self.started { self.header[0] } else { 0 };
            if !self.started || kind == b'S' || kind == b'Q' {
                self.owed += 1;
            }
            self.messages += 1;
            match kind {
                b'P' | b'B' | b'E' | b'D' | b'C' | b'H' => self.open = true,
                b'S' => self.open = false,
                _ => {}
            }
            self.started = true;
            self.got = 0;
        }
    }

    /// Between two requests: no message half written, no extended request without its `Sync`.
    fn between(&self) -> bool {
        self.got == 0 && self.left == 0 && !self.open
    }
}

/// How long a flight waits for the driver to read the answers it is owed before the driver
/// runs the request itself (see [`Wire::lend_soon`]).
const OWED_WITHIN: Duration = Duration::from_millis(100);

/// Who speaks on a session's socket now (ADR 0061).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaker {
    /// The driver (tokio-postgres), through [`Bounded`].
    Driver,
    /// A request's flights, through [`Lent`], between two of the driver's requests.
    Flights,
    /// A flight was given up with its answers unread: the session is out of step for both.
    Lost,
}

/// A session's socket with the framing of what the driver reads from it, shared by the
/// driver's stream ([`Bounded`]) and the flights' ([`Lent`]): one of them speaks at a time
/// (ADR 0061). The driver's task reads its socket all the time; while the flights speak, its
/// reads and writes wait, and it goes on where it left off once they are done, or fails once a
/// flight lost the session (the connection then ends, and the pool opens another).
#[derive(Debug)]
pub(crate) struct Wire {
    state: Mutex<Wired>,
    /// Woken when the driver read a `ReadyForQuery` (see [`Wire::lend_soon`]).
    answered: tokio::sync::Notify,
}

#[derive(Debug)]
struct Wired {
    socket: Socket,
    framing: Framing,
    cuts: Arc<Cuts>,
    slot: Arc<Mutex<Option<Cut>>>,
    /// The cut, once made: every later read fails with it.
    failed: Option<Cut>,
    /// What the driver wrote.
    sent: Sent,
    speaker: Speaker,
    /// The driver's task, waiting while the flights speak.
    parked: Vec<Waker>,
    /// The driver tried to write while the flights spoke, and has not written since: the
    /// socket is not lent again until it has, and has read the answer (else flights that
    /// follow each other closely, each taking the socket before the woken driver runs, would
    /// keep its `Close` of a statement it stopped using from ever being sent).
    driver_would_write: bool,
    /// The driver's task as it last waited to read, and to write: the flights' reads and
    /// writes take the socket's readiness over, so when they give the socket back it is
    /// registered as the socket's reader again, or woken to wait on it again
    /// ([`Wire::hand_over`]).
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl Wire {
    /// A session's wire over `socket`, the driver speaking; what it cuts goes to `slot`.
    fn over(
        socket: Socket,
        bounds: Bounds,
        cuts: &Arc<Cuts>,
        slot: &Arc<Mutex<Option<Cut>>>,
    ) -> Arc<Wire> {
        Arc::new(Wire {
            answered: tokio::sync::Notify::new(),
            state: Mutex::new(Wired {
                socket,
                framing: Framing::new(bounds),
                cuts: Arc::clone(cuts),
                slot: Arc::clone(slot),
                failed: None,
                sent: Sent::default(),
                speaker: Speaker::Driver,
                parked: Vec::new(),
                driver_would_write: false,
                reader: None,
                writer: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Wired> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the socket to flights, when the driver stands between two messages both ways,
    /// has read every `ReadyForQuery` it is owed, and nothing was cut. The caller holds the
    /// connection's lease, so the driver has no request out but a closed statement's, whose
    /// answer it must read before the socket is lent. `None` leaves the driver speaking.
    /// `flights` (the borrowing task) is woken when bytes arrive from then on, not the driver
    /// ([`Socket::claim_reader`]).
    fn lend(self: &Arc<Self>, flights: &Waker) -> Option<Loan> {
        let mut wired = self.lock();
        let between = matches!(wired.framing.state, State::Header { got: 0 })
            && wired.sent.between()
            && wired.sent.owed == wired.framing.ready;
        if wired.speaker != Speaker::Driver
            || wired.failed.is_some()
            || !between
            || wired.driver_would_write
        {
            return None;
        }
        wired.speaker = Speaker::Flights;
        wired.socket.claim_reader(flights);
        Some(Loan {
            wire: Arc::clone(self),
            returned: false,
        })
    }

    /// [`Wire::lend`], once the driver has read the answers it is owed (a closed statement's,
    /// which arrive within a round trip): waits for them up to [`OWED_WITHIN`].
    pub(crate) async fn lend_soon(self: &Arc<Self>) -> Option<Loan> {
        // Lent to the task that asks, as it asks (see `Wire::lend`).
        let lend = || std::future::poll_fn(|cx| Poll::Ready(self.lend(cx.waker())));
        // Most often the driver owes nothing: lent at once, with no waiter registered.
        if let Some(loan) = lend().await {
            return Some(loan);
        }
        let deadline = tokio::time::Instant::now() + OWED_WITHIN;
        loop {
            let answered = self.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            if let Some(loan) = lend().await {
                return Some(loan);
            }
            if !self.owes() {
                return None;
            }
            tokio::time::timeout_at(deadline, answered).await.ok()?;
        }
    }

    /// How many messages the driver has written on the session: flights that rely on what the
    /// session keeps between them (the unnamed statement, which a driver's `Parse` or `Query`
    /// replaces) know by it whether the driver spoke since.
    pub(crate) fn driver_messages(&self) -> u64 {
        self.lock().sent.messages
    }

    /// Whether the driver waits for an answer, or to write a request (or the rest of one) whose
    /// answer it will wait for: the socket could be lent once it has it.
    fn owes(&self) -> bool {
        let wired = self.lock();
        wired.speaker == Speaker::Driver
            && wired.failed.is_none()
            && (wired.sent.owed > wired.framing.ready
                || wired.driver_would_write
                || !wired.sent.between())
    }

    /// Gives the socket to `to` and wakes the driver's task where it must look at it again: a
    /// poll it made while the flights spoke, a write it waits to make, and its read unless the
    /// socket can wait for the next bytes on its behalf ([`Socket::rearm_reader`]). The flights'
    /// reads took the socket's readiness over; waking the driver after every flight only to
    /// have it wait again cost a wake-up and a poll per request, and its lock of the wire
    /// contended with the next flight's.
    fn hand_over(&self, to: Speaker) {
        let parked = {
            let mut wired = self.lock();
            wired.speaker = to;
            let mut parked = std::mem::take(&mut wired.parked);
            let mut reader = wired.reader.take();
            if to == Speaker::Driver
                && let Some(waiting) = &reader
                && wired.socket.rearm_reader(waiting)
            {
                // It stays the socket's reader, registered: it is woken when bytes come.
                wired.reader = reader.take();
            }
            for waiting in [reader, wired.writer.take()].into_iter().flatten() {
                if !parked.iter().any(|w| w.will_wake(&waiting)) {
                    parked.push(waiting);
                }
            }
            parked
        };
        parked.into_iter().for_each(Waker::wake);
    }

    /// The flights' side of the socket: speaks only while a [`Loan`] holds it.
    pub(crate) fn lent(self: &Arc<Self>) -> Lent {
        Lent(Arc::downgrade(self))
    }

    fn lost() -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the session's flight was given up with its answers unread",
        )
    }

    /// Polls the driver's side (`writes`: to write): it waits while the flights speak.
    fn driver<T>(
        &self,
        cx: &mut Context<'_>,
        writes: bool,
        poll: impl FnOnce(&mut Wired, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let mut wired = self.lock();
        match wired.speaker {
            Speaker::Driver => poll(&mut wired, cx),
            Speaker::Flights => {
                wired.driver_would_write |= writes;
                if !wired.parked.iter().any(|w| w.will_wake(cx.waker())) {
                    wired.parked.push(cx.waker().clone());
                }
                Poll::Pending
            }
            Speaker::Lost => Poll::Ready(Err(Wire::lost())),
        }
    }
}

/// The socket lent to a request's flights; dropped before [`Loan::give_back`] (the flight was
/// given up, its answers unread), the session is lost for the driver too, which then ends it.
#[derive(Debug)]
pub(crate) struct Loan {
    wire: Arc<Wire>,
    returned: bool,
}

impl Loan {
    /// The flights are done, every answer read: the driver speaks again.
    pub(crate) fn give_back(mut self) {
        self.returned = true;
        self.wire.hand_over(Speaker::Driver);
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if !self.returned {
            self.wire.hand_over(Speaker::Lost);
        }
    }
}

/// The flights' stream over a session's [`Wire`]: reads and writes fail unless a [`Loan`]
/// holds it. It does not keep the socket open: once the driver's connection ended, it fails.
#[derive(Debug)]
pub(crate) struct Lent(std::sync::Weak<Wire>);

impl Lent {
    fn flights<T>(
        &self,
        poll: impl FnOnce(Pin<&mut Socket>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let Some(wire) = self.0.upgrade() else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the session's connection ended",
            )));
        };
        let mut wired = wire.lock();
        if wired.speaker != Speaker::Flights {
            return Poll::Ready(Err(io::Error::other(
                "the session is not lent to flights now",
            )));
        }
        poll(Pin::new(&mut wired.socket))
    }
}

impl AsyncRead for Lent {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.flights(|socket| socket.poll_read(cx, buf))
    }
}

impl AsyncWrite for Lent {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.flights(|socket| socket.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flights(|socket| socket.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The driver's connection closes the socket.
        Poll::Ready(Ok(()))
    }
}

/// The driver's stream: a socket whose incoming bytes pass through [`Framing`].
#[derive(Debug)]
pub(crate) struct Bounded {
    wire: Arc<Wire>,
}

impl Bounded {
    fn fail(cut: Cut) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("PostgreSQL sent a message larger than this server takes: {cut:?}"),
        )
    }
}

impl AsyncRead for Bounded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let answered = &self.wire.answered;
        self.wire.driver(cx, false, |this, cx| {
            if let Some(cut) = this.failed {
                return Poll::Ready(Err(Bounded::fail(cut)));
            }
            let before = buf.filled().len();
            let polled = Pin::new(&mut this.socket).poll_read(cx, buf);
            if polled.is_pending()
                && !this
                    .reader
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
            {
                this.reader = Some(cx.waker().clone());
            }
            if !matches!(polled, Poll::Ready(Ok(()))) {
                return polled;
            }
            let had_pid = this.framing.pid.is_some();
            let ready = this.framing.ready;
            let fed = this.framing.feed(&buf.filled()[before..]);
            if this.framing.ready != ready {
                answered.notify_waiters();
            }
            if !had_pid && let Some(pid) = this.framing.pid {
                this.cuts.register(pid, &this.slot);
            }
            if let Err(cut) = fed {
                *this.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(cut);
                this.failed = Some(cut);
                tracing::warn!(
                    ?cut,
                    "closed a PostgreSQL connection: a message passed its bound"
                );
                return Poll::Ready(Err(Bounded::fail(cut)));
            }
            Poll::Ready(Ok(()))
        })
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.wire.driver(cx, true, |this, cx| {
            let written = Pin::new(&mut this.socket).poll_write(cx, buf);
            match written {
                Poll::Ready(Ok(n)) => {
                    this.sent.feed(&buf[..n]);
                    this.driver_would_write = false;
                }
                // The connection fails with it: nothing waits for the driver to write again.
                Poll::Ready(Err(_)) => this.driver_would_write = false,
                Poll::Pending => {
                    if !this
                        .writer
                        .as_ref()
                        .is_some_and(|w| w.will_wake(cx.waker()))
                    {
                        this.writer = Some(cx.waker().clone());
                    }
                }
            }
            written
        })
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.wire.driver(cx, false, |this, cx| {
            Pin::new(&mut this.socket).poll_flush(cx)
        })
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut wired = self.wire.lock();
        Pin::new(&mut wired.socket).poll_shutdown(cx)
    }
}

/// The order `config`'s hosts are tried in: as written, or shuffled for
/// `load_balance_hosts=random`.
fn host_order(config: &Config) -> Vec<usize> {
    let count = config.get_hosts().len().max(config.get_hostaddrs().len());
    let mut order: Vec<usize> = (0..count).collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        use rand::seq::SliceRandom as _;
        order.shuffle(&mut rand::rng());
    }
    order
}

/// Opens a socket to host `index` of `config`, as tokio-postgres would: with its port (one
/// port for all, or one each; 5432 by default), its `hostaddr` instead of a name lookup,
/// `connect_timeout` per address tried, TCP keepalives and `tcp_user_timeout` as configured,
/// `TCP_NODELAY`; a host that is a path is a directory holding the Unix socket. Then TLS, as
/// `tls` says (never over a Unix socket, as libpq).
async fn open_host(config: &Config, index: usize, tls: &PgTls) -> io::Result<Socket> {
    match open_raw(config, index).await? {
        Socket::Tcp(stream) => match tls.negotiate(stream, config, index).await? {
            Negotiated::Tls(stream) => Ok(Socket::Tls(stream)),
            Negotiated::Plain(stream) => Ok(Socket::Tcp(stream)),
            Negotiated::Reopen => open_raw(config, index).await,
        },
        other => Ok(other),
    }
}

/// The socket of [`open_host`], before TLS.
async fn open_raw(config: &Config, index: usize) -> io::Result<Socket> {
    let port = match config.get_ports() {
        [] => 5432,
        [one] => *one,
        many => many.get(index).copied().unwrap_or(5432),
    };
    let timeout = config.get_connect_timeout().copied();
    match (
        config.get_hostaddrs().get(index),
        config.get_hosts().get(index),
    ) {
        (Some(addr), _) => within(timeout, tcp(config, (*addr, port).into())).await,
        (None, Some(Host::Tcp(name))) => {
            let mut opened = Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no address for {name}"),
            ));
            for addr in tokio::net::lookup_host((name.as_str(), port)).await? {
                opened = within(timeout, tcp(config, addr)).await;
                if opened.is_ok() {
                    break;
                }
            }
            opened
        }
        #[cfg(unix)]
        (None, Some(Host::Unix(dir))) => {
            let path = dir.join(format!(".s.PGSQL.{port}"));
            within(timeout, async {
                UnixStream::connect(path).await.map(Socket::Unix)
            })
            .await
        }
        #[cfg(not(unix))]
        (None, Some(Host::Unix(_))) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "Unix sockets are not supported here",
        )),
        (None, None) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no host to connect to",
        )),
    }
}

/// Opens a socket to the first of `target`'s hosts that answers (see [`open_host`]).
pub(crate) async fn open(target: &Target) -> io::Result<Socket> {
    let config = &target.config;
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no host to connect to");
    for index in host_order(config) {
        match open_host(config, index, &target.tls).await {
            Ok(socket) => return Ok(socket),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn tcp(config: &Config, addr: std::net::SocketAddr) -> io::Result<Socket> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let socket = socket2::SockRef::from(&stream);
    #[cfg(target_os = "linux")]
    if let Some(timeout) = config.get_tcp_user_timeout() {
        socket.set_tcp_user_timeout(Some(*timeout))?;
    }
    if config.get_keepalives() {
        let mut keepalive = socket2::TcpKeepalive::new().with_time(config.get_keepalives_idle());
        #[cfg(not(any(target_os = "openbsd", target_os = "redox", target_os = "solaris")))]
        if let Some(interval) = config.get_keepalives_interval() {
            keepalive = keepalive.with_interval(interval);
        }
        #[cfg(not(any(
            target_os = "openbsd",
            target_os = "redox",
            target_os = "solaris",
            target_os = "windows"
        )))]
        if let Some(retries) = config.get_keepalives_retries() {
            keepalive = keepalive.with_retries(retries);
        }
        socket.set_tcp_keepalive(&keepalive)?;
    }
    Ok(Socket::Tcp(stream))
}

async fn within<T>(
    timeout: Option<Duration>,
    connect: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match timeout {
        Some(timeout) => tokio::time::timeout(timeout, connect)
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection timed out",
                ))
            }),
        None => connect.await,
    }
}

/// Cancels the statement a session runs, over a socket of the server's own (a connection
/// opened by `connect_raw` has no address in its cancel token), under TLS as the session is.
pub(crate) async fn cancel(token: &CancelToken, target: &Target) {
    // A server that stopped answering (paused, cut off) never closes the cancel's connection:
    // the cancel is given up after [`STOP_WITHIN`], and its session with it by the caller.
    let sent = async {
        match open(target).await {
            Ok(socket) => token
                .cancel_query_raw(socket, NoTls)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    };
    let cancelled = tokio::time::timeout(super::STOP_WITHIN, sent)
        .await
        .unwrap_or_else(|_| Err("no answer in time".to_owned()));
    if let Err(why) = cancelled {
        tracing::debug!(error = %why, "cannot cancel a statement");
    }
}

/// A stream that fails at once with the error that kept a socket from opening: through
/// `connect_raw` it becomes the driver's own connection error, with its cause.
#[derive(Debug)]
struct Unopened(Option<io::Error>);

impl Unopened {
    fn error(&mut self) -> io::Error {
        self.0
            .take()
            .unwrap_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "not connected"))
    }
}

impl AsyncRead for Unopened {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.get_mut().error()))
    }
}

impl AsyncWrite for Unopened {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(self.get_mut().error()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.get_mut().error()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What [`Connect::connect`] returns.
type Connecting<'a> = Pin<
    Box<
        dyn Future<Output = Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>>
            + Send
            + 'a,
    >,
>;

/// deadpool-postgres's way to open a client-role connection: over [`Bounded`].
#[derive(Debug)]
pub(crate) struct BoundedConnect {
    pub(crate) bounds: Bounds,
    pub(crate) cuts: Arc<Cuts>,
    pub(crate) tls: Arc<PgTls>,
}

/// A connection of the server's own (the set-up's, the role keeper's, the reaper's): as the
/// pool's, with no bound on messages. The driver runs in the returned task.
pub(crate) async fn connect(
    target: &Target,
) -> Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let unbounded = BoundedConnect {
        bounds: Bounds {
            message: usize::MAX,
            cell: usize::MAX,
        },
        cuts: Arc::default(),
        tls: Arc::clone(&target.tls),
    };
    unbounded.connect(&target.config).await
}

impl Connect for BoundedConnect {
    fn connect(&self, pg_config: &Config) -> Connecting<'_> {
        let config = pg_config.clone();
        Box::pin(async move {
            let mut last = None;
            for index in host_order(&config) {
                match self.connect_host(&config, index).await {
                    Ok(Some(connected)) => return Ok(connected),
                    // The session is not what `target_session_attrs` asks for: the next host.
                    Ok(None) => {
                        last = Some(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            "no host has the session attributes target_session_attrs asks for",
                        ));
                    }
                    Err(Failed::Socket(e)) => last = Some(e),
                    Err(Failed::Postgres(e)) => return Err(e),
                }
            }
            let e = last.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "no host to connect to")
            });
            // Through the driver, so that the error is its own connection error.
            match config.connect_raw(Unopened(Some(e)), NoTls).await {
                Err(e) => Err(e),
                Ok(_) => unreachable!("a stream that fails every call cannot log in"),
            }
        })
    }
}

/// Why one host gave no connection.
enum Failed {
    /// No socket: the next host may answer.
    Socket(io::Error),
    /// PostgreSQL refused the login (or the session broke): as tokio-postgres does, no other
    /// host is tried.
    Postgres(tokio_postgres::Error),
}

impl BoundedConnect {
    /// A connection to host `index`, or `None` when its session is not what
    /// `target_session_attrs` asks for.
    async fn connect_host(
        &self,
        config: &Config,
        index: usize,
    ) -> Result<Option<(Client, tokio::task::JoinHandle<()>)>, Failed> {
        let socket = open_host(config, index, &self.tls)
            .await
            .map_err(Failed::Socket)?;
        let slot = Arc::new(Mutex::new(None));
        let wire = Wire::over(socket, self.bounds, &self.cuts, &slot);
        let stream = Bounded {
            wire: Arc::clone(&wire),
        };
        let (client, connection) = config
            .connect_raw(stream, NoTls)
            .await
            .map_err(Failed::Postgres)?;
        let cuts = Arc::clone(&self.cuts);
        let pid = client_pid(&cuts, &slot);
        if let Some(pid) = pid {
            cuts.keep_wire(pid, &wire);
        }
        drop(wire);
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL connection ended");
            }
            if let Some(pid) = pid {
                cuts.forget_uncut(pid);
                cuts.forget_wire(pid);
            }
        });
        let wanted = match config.get_target_session_attrs() {
            TargetSessionAttrs::ReadWrite => "off",
            TargetSessionAttrs::ReadOnly => "on",
            _ => return Ok(Some((client, task))),
        };
        let read_only = client
            .query_one("SHOW transaction_read_only", &[])
            .await
            .map_err(Failed::Postgres)?;
        if read_only.get::<_, &str>(0) == wanted {
            Ok(Some((client, task)))
        } else {
            Ok(None)
        }
    }
}

/// The backend process id registered for `slot`, if `BackendKeyData` passed.
fn client_pid(cuts: &Cuts, slot: &Arc<Mutex<Option<Cut>>>) -> Option<i32> {
    cuts.by_backend
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(_, registered)| Arc::ptr_eq(registered, slot))
        .map(|(pid, _)| *pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A wire over one end of a socket pair, and the other end (the "backend").
    #[cfg(unix)]
    fn wire_pair() -> (Arc<Wire>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let slot = Arc::new(Mutex::new(None));
        let wire = Wire::over(Socket::Unix(ours), bounds(), &Arc::default(), &slot);
        (wire, theirs)
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_lent_wire_parks_the_driver_until_it_is_given_back() {
        let (wire, mut backend) = wire_pair();
        let mut driver = Bounded {
            wire: Arc::clone(&wire),
        };
        let mut flights = wire.lent();
        // Not lent: the flights' side refuses to speak.
        assert!(flights.write_all(b"x").await.is_err());
        let loan = wire
            .lend(Waker::noop())
            .expect("the driver stands between messages");
        assert!(wire.lend(Waker::noop()).is_none(), "lent once at a time");
        backend.write_all(&message(b'Z', b"I")).await.unwrap();
        // The flight reads what the backend sent; the driver waits meanwhile.
        let mut got = [0; 6];
        flights.read_exact(&mut got).await.unwrap();
        assert_eq!(got.as_slice(), message(b'Z', b"I").as_slice());
        backend.write_all(&message(b'Z', b"T")).await.unwrap();
        let mut parked = [0; 6];
        let waited =
            tokio::time::timeout(Duration::from_millis(50), driver.read_exact(&mut parked)).await;
        assert!(
            waited.is_err(),
            "the driver reads nothing while flights speak"
        );
        loan.give_back();
        driver.read_exact(&mut parked).await.unwrap();
        assert_eq!(parked.as_slice(), message(b'Z', b"T").as_slice());
        // Given back: the flights' side is refused again.
        assert!(flights.read_exact(&mut got).await.is_err());
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_driver_that_would_write_while_flights_speak_writes_and_is_answered_before_the_next_loan()
     {
        let (wire, mut backend) = wire_pair();
        let mut driver = Bounded {
            wire: Arc::clone(&wire),
        };
        // Logged in: the startup message, answered by one ReadyForQuery.
        let mut startup = 9u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&[0, 3, 0, 0, 0]);
        driver.write_all(&startup).await.unwrap();
        backend.write_all(&message(b'Z', b"I")).await.unwrap();
        let mut ready = [0; 6];
        driver.read_exact(&mut ready).await.unwrap();
        let loan = wire.lend(Waker::noop()).expect("between requests");
        // The driver lets a statement go while the flights speak: its Close waits.
        let close = [message(b'C', b"Ss1\0"), message(b'S', b"")].concat();
        let waited =
            tokio::time::timeout(Duration::from_millis(50), driver.write_all(&close)).await;
        assert!(
            waited.is_err(),
            "the driver writes nothing while flights speak"
        );
        loan.give_back();
        assert!(
            wire.lend(Waker::noop()).is_none(),
            "not lent again before the driver wrote"
        );
        driver.write_all(&close).await.unwrap();
        assert!(
            wire.lend(Waker::noop()).is_none(),
            "not lent again before the driver read its answer"
        );
        let answer = [message(b'3', b""), message(b'Z', b"I")].concat();
        backend.write_all(&answer).await.unwrap();
        let mut got = vec![0; answer.len()];
        driver.read_exact(&mut got).await.unwrap();
        assert!(
            wire.lend(Waker::noop()).is_some(),
            "lent once the driver was answered"
        );
    }

    #[test]
    fn what_the_driver_wrote_says_when_it_stands_between_requests() {
        let mut sent = Sent::default();
        // The startup message has no type byte; the login ends with one ReadyForQuery.
        let mut startup = 9u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&[0, 3, 0, 0, 0]);
        sent.feed(&startup);
        assert_eq!((sent.owed, sent.between()), (1, true));
        // A dropped statement's Close, written in two pieces, then its Sync.
        let close = message(b'C', b"Ss1\0");
        sent.feed(&close[..2]);
        assert!(!sent.between(), "inside a message");
        sent.feed(&close[2..]);
        assert!(!sent.between(), "an extended request without its Sync");
        sent.feed(&message(b'S', b""));
        assert_eq!((sent.owed, sent.between()), (2, true));
        // A simple query is a request of its own; a password message is not.
        sent.feed(&message(b'Q', b"SELECT 1\0"));
        sent.feed(&message(b'p', b"secret\0"));
        assert_eq!((sent.owed, sent.between()), (3, true));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_loan_dropped_unreturned_loses_the_session_for_the_driver() {
        let (wire, _backend) = wire_pair();
        let mut driver = Bounded {
            wire: Arc::clone(&wire),
        };
        drop(wire.lend(Waker::noop()).unwrap());
        let mut byte = [0; 1];
        let lost = driver.read_exact(&mut byte).await.unwrap_err();
        assert_eq!(lost.kind(), io::ErrorKind::BrokenPipe);
        assert!(driver.write_all(b"x").await.is_err());
        assert!(
            wire.lend(Waker::noop()).is_none(),
            "a lost session is never lent again"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_driver_inside_a_message_is_not_lent_and_a_gone_wire_fails_its_flights() {
        let (wire, mut backend) = wire_pair();
        let mut driver = Bounded {
            wire: Arc::clone(&wire),
        };
        let whole = message(b'C', b"SELECT 1\0");
        backend.write_all(&whole[..3]).await.unwrap();
        let mut part = [0; 3];
        driver.read_exact(&mut part).await.unwrap();
        assert!(
            wire.lend(Waker::noop()).is_none(),
            "the driver is inside a message"
        );
        backend.write_all(&whole[3..]).await.unwrap();
        let mut rest = vec![0; whole.len() - 3];
        driver.read_exact(&mut rest).await.unwrap();
        let mut flights = wire.lent();
        let loan = wire.lend(Waker::noop()).expect("between messages again");
        loan.give_back();
        drop(driver);
        drop(wire);
        let gone = flights.write_all(b"x").await.unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::NotConnected);
    }

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(u32::try_from(body.len()).unwrap() + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn row(cells: &[Option<&[u8]>]) -> Vec<u8> {
        let mut body = (u16::try_from(cells.len()).unwrap()).to_be_bytes().to_vec();
        for cell in cells {
            match cell {
                None => body.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(value) => {
                    body.extend_from_slice(&(u32::try_from(value.len()).unwrap()).to_be_bytes());
                    body.extend_from_slice(value);
                }
            }
        }
        message(b'D', &body)
    }

    fn bounds() -> Bounds {
        Bounds {
            message: 100,
            cell: 50,
        }
    }

    /// Feeds `bytes` one byte at a time and all at once: both must agree.
    fn feed(bytes: &[u8]) -> Result<(), Cut> {
        let mut whole = Framing::new(bounds());
        let at_once = whole.feed(bytes);
        let mut split = Framing::new(bounds());
        let by_byte = bytes
            .iter()
            .try_for_each(|b| split.feed(std::slice::from_ref(b)));
        assert_eq!(at_once, by_byte);
        at_once
    }

    #[test]
    fn rows_within_the_bounds_pass() {
        let mut bytes = message(b'2', &[]);
        bytes.extend(row(&[Some(&[1; 50]), None, Some(&[]), Some(&[2; 30])]));
        bytes.extend(message(b'C', b"SELECT 1\0"));
        bytes.extend(message(b'N', &[b'x'; 100]));
        assert_eq!(feed(&bytes), Ok(()));
    }

    #[test]
    fn a_cell_over_its_bound_is_cut_at_its_length() {
        let mut bytes = message(b'2', &[]);
        bytes.extend(row(&[Some(b"a")]));
        // The second row's second cell declares 51 bytes; none of them need arrive.
        let mut second = row(&[Some(b"b"), Some(&[0; 51])]);
        second.truncate(5 + 2 + 4 + 1 + 4);
        bytes.extend(second);
        assert_eq!(
            feed(&bytes),
            Err(Cut::Cell {
                column: 1,
                row: 2,
                bytes: 51
            })
        );
    }

    #[test]
    fn a_row_over_its_bound_is_cut() {
        let bytes = row(&[Some(&[1; 40]), Some(&[2; 40]), Some(&[3; 40])]);
        assert!(matches!(feed(&bytes), Err(Cut::Row { row: 1, .. })));
    }

    #[test]
    fn other_messages_are_cut_by_their_declared_length() {
        let mut bytes = message(b'N', &[b'x'; 101]);
        bytes.truncate(5);
        assert_eq!(
            feed(&bytes),
            Err(Cut::Message {
                kind: b'N',
                bytes: 101
            })
        );
    }

    #[test]
    fn the_backend_key_names_the_session() {
        let mut key = 4242i32.to_be_bytes().to_vec();
        key.extend_from_slice(&7i32.to_be_bytes());
        let mut framing = Framing::new(bounds());
        let mut bytes = message(b'R', &0i32.to_be_bytes());
        bytes.extend(message(b'K', &key));
        bytes.extend(message(b'Z', b"I"));
        assert_eq!(framing.feed(&bytes), Ok(()));
        assert_eq!(framing.pid, Some(4242));
    }
}
