//! What one pooled connection keeps for its flights (ADR 0061): the flights' side of its
//! session (`wire::Lent` under `sqlhttp-pgwire`'s `Connection`), the server's statements
//! prepared on it once, and its cache of client statements; and the flights every read sends
//! whatever it runs: the server's statements' preparation, and the end and reset after a flight
//! PostgreSQL refused part of. A verified read itself is `read_flight`'s.
//!
//! The reset is the session's unnamed statement (ADR 0063, amending ADR 0061): a client's
//! function can `DEALLOCATE` and `PREPARE` any named statement of its session through dynamic
//! SQL, but never the unnamed one, so the reset always runs as the server wrote it, and it
//! drops whatever the function prepared (a statement prepared from SQL text), under the server's
//! names too. Only a `Parse` of the unnamed statement or a simple `Query` replaces it, and only
//! the server sends those: it is parsed again when the driver has spoken on the session since,
//! or when a flight that parsed it was refused anywhere. The read's `ROLLBACK` is prepared once
//! under a name of the server's: a function that took that name over runs its statement in the
//! read's place of `ROLLBACK`, which leaves the transaction open, and a session left so is
//! closed, never pooled. A name that went missing so is found by the next flight that binds it
//! (`26000`), which prepares the server's statements again.
//!
//! Knows the protocol's flights and the server's statements; nothing about requests, rows or
//! HTTP.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use sqlhttp_pgwire::{Connection, Error as WireError, Flight, Format, Param, TransactionStatus};
use tokio_postgres::types::Type;

use crate::config::Limits;
use crate::engine::postgres::aging::Clock;
use crate::engine::postgres::exec::CACHED_STATEMENTS;
use crate::engine::postgres::wire::{Lent, SLACK, Wire};
use crate::engine::postgres::{STOP_WITHIN, session};

/// The read's `BEGIN`, prepared once per connection under a name of the server's.
pub(super) const BEGIN_READ: (&str, &str) = (
    "_sqlhttp_begin_read",
    "BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ",
);

/// The read's statement timeout and lock timeout (bound, in milliseconds), and the log position
/// read once the snapshot is taken: this is the transaction's first statement that takes one,
/// so its snapshot is the one the client's statement sees, and the position an upper bound of
/// it (ADR 0039).
pub(super) const SETTINGS: (&str, &str) = (
    "_sqlhttp_read_settings",
    "SELECT pg_catalog.set_config('statement_timeout', $1, true), \
     pg_catalog.set_config('lock_timeout', $2, true), \
     pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text",
);

/// A write's `BEGIN` (ADR 0064), prepared once per connection under a name of the server's.
pub(super) const BEGIN_WRITE: (&str, &str) = (
    "_sqlhttp_begin_write",
    "BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED",
);

/// A write's statement timeout and lock timeout (bound, in milliseconds), and the transaction's
/// start, which its COMMIT's message checks (`transaction::Opened`).
pub(super) const WRITE_SETTINGS: (&str, &str) = (
    "_sqlhttp_write_settings",
    "SELECT pg_catalog.set_config('statement_timeout', $1, true), \
     pg_catalog.set_config('lock_timeout', $2, true), \
     EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text",
);

/// The read's end, prepared once per connection under a name of the server's.
pub(super) const END_READ: (&str, &str) = ("_sqlhttp_end_read", "ROLLBACK");

/// What outlives a rollback, reset (see `session::after_read`), as the unnamed statement; its
/// seed is bound. The seed and the session's advisory locks are reset inline; the PL/pgSQL
/// function, which also deallocates what a client's function prepared and closes `dblink`'s and
/// `postgres_fdw`'s links, runs only when there is such a statement or such an extension
/// (ADR 0065: the function's call cost a read more than its work). Every name is qualified,
/// operators too: the statement is parsed once and re-analysed under the search path of the day
/// when its plan is invalidated. One row, as the function's call answered.
const RESET_AFTER_READ: &str = "SELECT pg_catalog.setseed($1::pg_catalog.float8), \
     pg_catalog.pg_advisory_unlock_all(), \
     CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql) \
     OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e \
     WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) \
     THEN _sqlhttp.reset_after_read($1::pg_catalog.float8) END";

/// What one pooled connection keeps for its flights.
pub(super) struct Flights {
    pub(super) wire: Weak<Wire>,
    pub(super) connection: Connection<Lent>,
    /// The server's statements are prepared on the session.
    pub(super) prepared: bool,
    /// The unnamed statement is the reset, parsed when the driver had written this many
    /// messages on the session.
    reset_parsed: Option<u64>,
    /// Client statements by their rewritten text.
    statements: HashMap<String, Cached>,
    /// Client statements looked up on this connection so far: the cache's clock.
    clock: Clock,
    /// Statements to close on the session, in the next flight.
    to_close: Vec<String>,
    next: u64,
}

impl std::fmt::Debug for Flights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flights")
            .field("statements", &self.statements.len())
            .finish_non_exhaustive()
    }
}

/// A client statement prepared on the session: `statement` is `None` when flights do not run it
/// (a parameter or column of a type outside PostgreSQL's built-in ones, which needs the
/// catalog lookups the driver does).
struct Cached {
    name: String,
    statement: Option<Arc<Statement>>,
    /// The cache's [`Clock`] when it was last looked up.
    used: u64,
}

/// A client statement as flights bind and read it.
pub(super) struct Statement {
    pub(super) name: String,
    pub(super) params: Vec<Type>,
    pub(super) columns: Vec<(String, Type)>,
}

/// A statement cache's answer for a text.
pub(super) enum Lookup {
    /// Prepared on the session.
    Ready(Arc<Statement>),
    /// Flights do not run it.
    Driver,
    /// Not prepared yet: prepare it as this name.
    Unknown(String),
}

impl Flights {
    /// The flights of a connection over `wire`, their messages bounded as the driver's rows
    /// are.
    pub(super) fn new(wire: &Arc<Wire>, limits: &Limits) -> Flights {
        let max_message = limits
            .max_result_bytes
            .saturating_add(SLACK)
            .saturating_add(5);
        Flights {
            wire: Arc::downgrade(wire),
            connection: Connection::resume(wire.lent(), sqlhttp_pgwire::Limits { max_message }),
            prepared: false,
            reset_parsed: None,
            statements: HashMap::new(),
            clock: Clock::default(),
            to_close: Vec::new(),
            next: 0,
        }
    }

    /// What the cache knows of `sql`. Past [`CACHED_STATEMENTS`] texts every one is forgotten
    /// (and closed on the session by the next flight), as the driver's cache is; a statement
    /// not looked up in the last `aging::COLD_AFTER` lookups is forgotten before that (ADR 0067).
    pub(super) fn lookup(&mut self, sql: &str) -> Lookup {
        let (now, sweep) = self.clock.tick();
        if sweep {
            self.forget_cold();
        }
        if let Some(cached) = self.statements.get_mut(sql) {
            cached.used = now;
            return match &cached.statement {
                Some(statement) => Lookup::Ready(Arc::clone(statement)),
                None => Lookup::Driver,
            };
        }
        if self.statements.len() >= CACHED_STATEMENTS {
            self.forget_all();
        }
        self.next += 1;
        Lookup::Unknown(format!("_sqlhttp_f{}", self.next))
    }

    /// Keeps `sql`, prepared as `name` with the described `params` and `columns` (type OIDs);
    /// the statement as flights run it, `None` when they do not.
    pub(super) fn keep(
        &mut self,
        sql: &str,
        name: String,
        params: &[u32],
        columns: &[sqlhttp_pgwire::Column],
    ) -> Option<Arc<Statement>> {
        let params: Option<Vec<Type>> = params.iter().map(|&oid| Type::from_oid(oid)).collect();
        let columns: Option<Vec<(String, Type)>> = columns
            .iter()
            .map(|column| Some((column.name.clone(), Type::from_oid(column.type_oid)?)))
            .collect();
        let statement = params.zip(columns).map(|(params, columns)| {
            Arc::new(Statement {
                name: name.clone(),
                params,
                columns,
            })
        });
        self.statements.insert(
            sql.to_owned(),
            Cached {
                name,
                statement: statement.clone(),
                used: self.clock.now(),
            },
        );
        statement
    }

    /// Forgets `sql`'s statement (it went stale), closing it on the session.
    pub(super) fn forget(&mut self, sql: &str) {
        if let Some(cached) = self.statements.remove(sql) {
            self.to_close.push(cached.name);
        }
    }

    /// Forgets the statements not looked up in the last `aging::COLD_AFTER` lookups, closing each
    /// on the session.
    fn forget_cold(&mut self) {
        let clock = &self.clock;
        let to_close = &mut self.to_close;
        self.statements.retain(|_, cached| {
            let warm = !clock.is_cold(cached.used);
            if !warm {
                to_close.push(std::mem::take(&mut cached.name));
            }
            warm
        });
    }

    /// Forgets every statement, closing each on the session.
    pub(super) fn forget_all(&mut self) {
        self.to_close
            .extend(self.statements.drain().map(|(_, cached)| cached.name));
    }

    /// The server's statements went missing (a client's function deallocated them): they, and
    /// the client statements that may have gone with them, are prepared again.
    pub(super) fn lost_statements(&mut self) {
        self.prepared = false;
        self.forget_all();
    }

    /// Starts a flight that first closes what was forgotten (kept to close until a flight
    /// that carried them was answered: see [`Flights::closed`]). `None` when the connection is
    /// in doubt.
    pub(super) fn flight(&mut self) -> Option<Flight<'_, Lent>> {
        let mut flight = self.connection.flight().ok()?;
        for name in &self.to_close {
            // Names of the server's own making: they always encode.
            flight.close_statement(name).ok()?;
        }
        if !self.to_close.is_empty() {
            // Ended by a `Sync` of their own: a simple `Query` may follow (see `Flight::query`).
            flight.sync();
        }
        Some(flight)
    }

    /// Whether the next flight starts with Closes, ended by a `Sync` of their own (see
    /// [`Flights::flight`]): its first `ReadyForQuery` is theirs.
    pub(super) fn closing(&self) -> bool {
        !self.to_close.is_empty()
    }

    /// A flight from [`Flights::flight`] was sent and answered: what it closed is closed. (A
    /// flight never sent, its input refused as it was encoded, leaves them to the next; a
    /// `Close` sent twice is no error.)
    pub(super) fn closed(&mut self) {
        self.to_close.clear();
    }

    /// The driver's messages on the session so far (`None` once its connection ended).
    fn driver_messages(&self) -> Option<u64> {
        self.wire.upgrade().map(|wire| wire.driver_messages())
    }

    /// Whether the next flight's end must parse the reset (see [`add_end`]): the session's
    /// unnamed statement may not be it.
    pub(super) fn reset_to_parse(&self) -> bool {
        self.reset_parsed.is_none() || self.reset_parsed != self.driver_messages()
    }

    /// A flight whose end parsed the reset (see [`add_end`]) was answered: `whole` when nothing
    /// in it was refused and the reset answered as the reset, so the unnamed statement is it.
    /// (A refusal skips every message to the `Sync`, a `Parse` too.)
    pub(super) fn reset_parsed(&mut self, whole: bool) {
        self.reset_parsed = if whole { self.driver_messages() } else { None };
    }

    /// A flight parsed a statement of its own as the unnamed one (a write's savepoint) or sent
    /// a simple `Query` (a write's end): the reset is parsed again by the next read.
    pub(super) fn unnamed_replaced(&mut self) {
        self.reset_parsed = None;
    }

    /// Prepares the server's statements on the session (closing first any statement of the
    /// same name a client's function left), in one flight.
    pub(super) async fn prepare_fixed(&mut self) -> Result<(), WireError> {
        let Some(mut flight) = self.flight() else {
            return Err(WireError::Invalid("the connection is in doubt".into()));
        };
        for (name, sql) in [BEGIN_READ, SETTINGS, END_READ, BEGIN_WRITE, WRITE_SETTINGS] {
            flight.close_statement(name)?.parse(name, sql, &[])?;
        }
        flight.sync();
        flight.send().await?.finish().await?;
        self.closed();
        self.prepared = true;
        Ok(())
    }
}

/// What a flight leaves of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Left {
    /// Read to its last `ReadyForQuery`, idle and reset: it may serve again.
    Clean,
    /// Read to its end, but its end or reset failed: closed, not pooled.
    Unreset,
    /// Answers unread, or the socket failed: the session is lost.
    Lost,
}

/// What the last flight on `connection` left of its session.
pub(super) fn left_by(connection: &Connection<Lent>) -> Left {
    if connection.is_in_doubt() {
        Left::Lost
    } else if connection.transaction_status() == TransactionStatus::Idle {
        Left::Clean
    } else {
        Left::Unreset
    }
}

/// How a flight opens the server's transaction, with its settings bound: BEGIN and the
/// settings, prepared once per connection, and for a write its guard savepoint (its name is the
/// request's own, so it is parsed, as the unnamed statement).
#[derive(Debug, Clone, Copy)]
pub(super) enum Opening<'g> {
    /// `BEGIN READ ONLY`, the settings and the log position (`SETTINGS`).
    Read,
    /// `BEGIN READ WRITE`, the settings and the transaction's start (`WRITE_SETTINGS`), then
    /// `SAVEPOINT guard`.
    Write { guard: &'g str },
}

impl Opening<'_> {
    /// The statements it runs, before the client's: its settings' row is the second's.
    pub(super) fn statements(self) -> usize {
        match self {
            Opening::Read => 2,
            Opening::Write { .. } => 3,
        }
    }

    /// Adds it to `flight`, the settings' parameters being `settings`.
    pub(super) fn add(
        self,
        flight: &mut Flight<'_, Lent>,
        settings: &[Param<'_>],
    ) -> Result<(), WireError> {
        let (begin, set) = match self {
            Opening::Read => (BEGIN_READ.0, SETTINGS.0),
            Opening::Write { .. } => (BEGIN_WRITE.0, WRITE_SETTINGS.0),
        };
        flight
            .bind("", begin, &[], Format::Text)?
            .execute("", 0)?
            .bind("", set, settings, Format::Text)?
            .execute("", 0)?;
        if let Opening::Write { guard } = self {
            flight.statement(&format!("SAVEPOINT {guard}"))?;
        }
        Ok(())
    }
}

/// Ends a transaction PostgreSQL refused part of (it skipped to the flight's `Sync`) and resets
/// the session, in a flight of their own; a session whose end or reset failed is not pooled.
/// Both are parsed here, as the unnamed statement: the refusal may have been the server's
/// statements gone, `END_READ` with them.
pub(super) async fn end_and_reset(flights: &mut Flights) -> Left {
    let seed = session::seed();
    let sent = async {
        let Some(mut flight) = flights.flight() else {
            return Err(WireError::Invalid("the connection is in doubt".into()));
        };
        flight
            .statement(END_READ.1)?
            .parse("", RESET_AFTER_READ, &[])?
            .bind("", "", &[text(&seed)], Format::Text)?
            .execute("", 0)?
            .sync();
        let ended = flight.send().await?.finish().await;
        flights.closed();
        flights.reset_parsed(ended.is_ok());
        ended
    };
    match sent.await {
        // Idle, and nothing past its last answer: clean (`left_by`).
        Ok(_) => left_by(&flights.connection),
        Err(e) => {
            tracing::warn!(error = %e, "cannot end or reset a read's session; closing it");
            match left_by(&flights.connection) {
                Left::Lost => Left::Lost,
                Left::Clean | Left::Unreset => Left::Unreset,
            }
        }
    }
}

/// Ends a write's transaction (refused, failed, or not to be kept) and resets the session in a
/// flight of its own: `ROLLBACK` and the whole reset after a request
/// (`session::ROLLBACK_AND_RESET`), as one simple query, so no statement a client's function
/// prepared stands in for any of it. A write may have done what a read cannot (advanced a
/// sequence, set a setting for the session), which the reset after a read does not undo. A
/// session whose end or reset failed is not pooled.
pub(super) async fn rollback_and_reset(flights: &mut Flights) -> Left {
    flights.unnamed_replaced();
    let sent = tokio::time::timeout(STOP_WITHIN, async {
        let Some(mut flight) = flights.flight() else {
            return Err(WireError::Invalid("the connection is in doubt".into()));
        };
        flight.query(session::ROLLBACK_AND_RESET)?;
        let ended = flight.send().await?.finish().await;
        flights.closed();
        ended
    });
    // A rollback is quick unless the session is stuck (or its peer gone): past `STOP_WITHIN`
    // its answers go unread and the session is lost, which rolls it back too.
    let Ok(sent) = sent.await else {
        tracing::warn!("a write's rollback did not answer in time; closing its session");
        return Left::Lost;
    };
    match sent {
        // Idle, and nothing past its last answer: clean (`left_by`).
        Ok(_) => left_by(&flights.connection),
        Err(e) => {
            tracing::warn!(error = %e, "cannot end or reset a write's session; closing it");
            match left_by(&flights.connection) {
                Left::Lost => Left::Lost,
                Left::Clean | Left::Unreset => Left::Unreset,
            }
        }
    }
}

/// Ends the transaction `opening` opened, in a flight of its own, and resets the session as
/// its kind asks.
pub(super) async fn end_opened(flights: &mut Flights, opening: Opening<'_>) -> Left {
    match opening {
        Opening::Read => end_and_reset(flights).await,
        Opening::Write { .. } => rollback_and_reset(flights).await,
    }
}

/// Adds the prepared `ROLLBACK` and the reset with `seed` to `flight`, the reset parsed first
/// as the unnamed statement when `parse_reset` ([`Flights::reset_to_parse`]; the caller then
/// tells [`Flights::reset_parsed`] how the flight went).
pub(super) fn add_end(
    flight: &mut Flight<'_, Lent>,
    seed: &str,
    parse_reset: bool,
) -> Result<(), WireError> {
    flight
        .bind("", END_READ.0, &[], Format::Text)?
        .execute("", 0)?;
    if parse_reset {
        flight.parse("", RESET_AFTER_READ, &[])?;
    }
    flight
        .bind("", "", &[text(seed)], Format::Text)?
        .execute("", 0)?;
    Ok(())
}

/// A text parameter.
pub(super) fn text(value: &str) -> Param<'_> {
    Param {
        format: Format::Text,
        value: Some(value.as_bytes()),
    }
}
