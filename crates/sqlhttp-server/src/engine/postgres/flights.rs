//! A verified read on the primary in ONE flight of the extended protocol (ADR 0061): `BEGIN READ
//! ONLY`, its settings with the log position, the client's statement with its rows in binary,
//! `ROLLBACK` and the session's reset after a read, then one `Sync`; every statement of the
//! server's prepared once per connection (ADR 0060), the client's cached per connection.
//!
//! A flight speaks on the pooled connection's own session, lent by the driver between two of
//! its requests (`wire::Wire`): the lease, the pool, the cancel token, the cuts' bound and the
//! role's checks at login stay the driver's; [`Flights`] is what a connection keeps for its
//! flights. Rows go from the `DataRow`'s bytes straight into the shared result writer through
//! `types::write_cell`, bounded as `exec` bounds them; a message past the row bound is refused
//! from its header (`sqlhttp-pgwire`'s `Limits`).
//!
//! When PostgreSQL refuses anything in the flight it skips to the `Sync`: the end and the reset
//! then go in a flight of their own, and a session whose end or reset failed is not pooled. A
//! flight given up with answers unread loses the session for the driver too (it is closed).
//! What flights do not know yet (a type outside PostgreSQL's built-in ones, a replica) runs
//! through the driver as before ([`Inner::read_in_one_flight`] returns `None`).
//!
//! Knows the protocol's answers, the server's fixed statements and the result writer; nothing
//! about HTTP, pooling or replicas.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use sqlhttp_pgwire::{Answer, Connection, Error as WireError, Format, Param, TransactionStatus};
use tokio_postgres::types::Type;

use crate::config::Limits;
use crate::engine::postgres::exec::{CACHED_STATEMENTS, value_too_big};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::types::{self, Bound};
use crate::engine::postgres::wire::{Lent, SLACK, Wire};
use crate::engine::postgres::{Inner, errors, placeholders, sandbox, tag};
use crate::engine::stream::Sink;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::protocol::result::{self, RowWriter};

/// The server's statements, prepared once per connection under names of their own.
const BEGIN_READ: (&str, &str) = (
    "_sqlhttp_begin_read",
    "BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ",
);
/// The read's statement timeout and lock timeout (bound, in milliseconds), and the log
/// position read once the snapshot is taken (this is the transaction's first statement that
/// takes one: its snapshot is the one the client's statement sees).
const SETTINGS: (&str, &str) = (
    "_sqlhttp_read_settings",
    "SELECT pg_catalog.set_config('statement_timeout', $1, true), \
     pg_catalog.set_config('lock_timeout', $2, true), \
     pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text",
);
const ROLLBACK: (&str, &str) = ("_sqlhttp_rollback", "ROLLBACK");
/// What outlives a rollback, reset (see `session::after_read`): its seed is bound.
const RESET_AFTER_READ: (&str, &str) = (
    "_sqlhttp_reset_after_read",
    "SELECT _sqlhttp.reset_after_read($1::pg_catalog.float8)",
);
const FIXED: [(&str, &str); 4] = [BEGIN_READ, SETTINGS, ROLLBACK, RESET_AFTER_READ];

/// What one pooled connection keeps for its flights.
pub(super) struct Flights {
    wire: Weak<Wire>,
    connection: Connection<Lent>,
    /// The server's statements are prepared on the session.
    prepared: bool,
    /// Client statements by their rewritten text; `None`: one flights do not run (a type they
    /// do not know), run by the driver.
    statements: HashMap<String, Option<Arc<Statement>>>,
    next: u64,
}

impl std::fmt::Debug for Flights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flights")
            .field("statements", &self.statements.len())
            .finish_non_exhaustive()
    }
}

/// A client statement prepared on the session.
struct Statement {
    name: String,
    params: Vec<Type>,
    columns: Vec<(String, Type)>,
}

impl Flights {
    /// The flights of a connection over `wire`, its rows bounded as the driver's are.
    pub(super) fn new(wire: &Arc<Wire>, limits: &Limits) -> Flights {
        let max_message = limits
            .max_result_bytes
            .saturating_add(SLACK)
            .saturating_add(5);
        Flights {
            wire: Arc::downgrade(wire),
            connection: Connection::resume(wire.lent(), sqlhttp_pgwire::Limits { max_message }),
            prepared: false,
            statements: HashMap::new(),
            next: 0,
        }
    }
}

/// What a flight's failure leaves of the session.
enum Left {
    /// Read to its last `ReadyForQuery`, idle and reset: it may serve again.
    Clean,
    /// Read to its end, but its end or reset failed: closed, not pooled.
    Unreset,
    /// Answers unread, or the socket failed: the session is lost.
    Lost,
}

impl Inner {
    /// Runs `request`, a verified read on the primary, on `lease` in one flight, writing its
    /// body into `out` and `sink` as `exec::write_rows` does, and returns the rows it changed
    /// (0) with whether the session may serve again (the lease is then clean). `None` when
    /// flights cannot run it here and nothing was sent for it: the caller runs it through the
    /// driver.
    pub(super) async fn read_in_one_flight(
        &self,
        lease: &Lease,
        request: &SqlRequest,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> Option<(Result<u64, ApiError>, bool)> {
        let mut flights = lease.take_flights()?;
        if let Err(err) = sandbox::check_text(&request.sql) {
            lease.keep_flights(flights);
            return Some((Err(err), true));
        }
        let rewritten = placeholders::rewrite(&request.sql);
        if let Err(err) = rewritten.check_bound(request.params.len()) {
            lease.keep_flights(flights);
            return Some((Err(err), true));
        }
        let wire = flights.wire.upgrade();
        let lent = match &wire {
            Some(wire) => wire.lend_soon().await,
            None => None,
        };
        let Some(loan) = lent else {
            lease.keep_flights(flights);
            return None;
        };
        let mut loan = Some(loan);
        let mut fresh = false;
        loop {
            let (ran, left) = self
                .try_flight(
                    &mut flights,
                    lease,
                    request,
                    &rewritten.sql,
                    fresh,
                    out,
                    sink,
                )
                .await;
            match left {
                Left::Clean => {}
                Left::Unreset => lease.retire(),
                Left::Lost => {
                    // The loan dropped unreturned: the driver's connection ends too.
                    drop(loan.take());
                    let ran = ran.unwrap_or_else(|_| Err(StaleOr::Error(ApiError::internal())));
                    return Some((ran.map_err(StaleOr::into_error), false));
                }
            }
            match ran {
                // Nothing was sent: the driver runs it.
                Err(Fallback) => {
                    if let Some(loan) = loan.take() {
                        loan.give_back();
                    }
                    // A connection whose server statements could not be prepared reads
                    // through the driver from now on.
                    if flights.prepared {
                        lease.keep_flights(flights);
                    }
                    return None;
                }
                Ok(Err(Stale)) if !fresh && !sink.started() => {
                    tracing::debug!("a cached statement went stale; running the read again");
                    fresh = true;
                    out.clear();
                }
                Ok(ran) => {
                    if let Some(loan) = loan.take() {
                        loan.give_back();
                    }
                    lease.keep_flights(flights);
                    return Some((ran.map_err(StaleOr::into_error), true));
                }
            }
        }
    }

    /// One try of [`Inner::read_in_one_flight`]: what it answers and what it leaves.
    #[expect(
        clippy::too_many_arguments,
        reason = "one read's parts, handed over from its loop"
    )]
    async fn try_flight(
        &self,
        flights: &mut Flights,
        lease: &Lease,
        request: &SqlRequest,
        sql: &str,
        fresh: bool,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> (Result<Result<u64, StaleOr>, Fallback>, Left) {
        if !flights.prepared {
            match prepare_fixed(&mut flights.connection).await {
                Ok(()) => flights.prepared = true,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot prepare the server's statements for flights");
                    return (Err(Fallback), left_by(&flights.connection));
                }
            }
        }
        if fresh {
            flights.statements.remove(sql);
        }
        let cached = flights.statements.contains_key(sql);
        let statement = match flights.statement(sql).await {
            Ok(Some(statement)) => statement,
            Ok(None) => return (Err(Fallback), Left::Clean),
            Err(e) => {
                let left = left_by(&flights.connection);
                return (Ok(Err(StaleOr::Error(self.map_wire(&e)))), left);
            }
        };
        if statement.params.len() != request.params.len() {
            return (
                Ok(Err(StaleOr::Error(ApiError::sql(format!(
                    "wrong number of parameters: the statement takes {}, the request gave {}",
                    statement.params.len(),
                    request.params.len()
                ))))),
                Left::Clean,
            );
        }
        if let Some((name, ty)) = statement
            .columns
            .iter()
            .find(|(_, ty)| !types::is_supported(ty))
        {
            return (
                Ok(Err(StaleOr::Error(types::unsupported(name, ty)))),
                Left::Clean,
            );
        }
        let bound = match types::bind(&request.params, &statement.params) {
            Ok(bound) => bound,
            // The cached statement's types may be older than the schema: a fresh one decides.
            Err(_) if cached => return (Ok(Err(Stale)), Left::Clean),
            Err(err) => return (Ok(Err(StaleOr::Error(err))), Left::Clean),
        };
        let params: Vec<Param<'_>> = bound.iter().map(param).collect();
        let timeout = self.timeout_ms().to_string();
        let lock_wait = self.lock_wait_ms().to_string();
        let seed = seed();
        let settings = [text(&timeout), text(&lock_wait)];
        let Ok(mut flight) = flights.connection.flight() else {
            return (Err(Fallback), Left::Lost);
        };
        let encoded = (|| {
            flight
                .bind("", BEGIN_READ.0, &[], Format::Text)?
                .execute("", 0)?
                .bind("", SETTINGS.0, &settings, Format::Text)?
                .execute("", 0)?
                .bind("", &statement.name, &params, Format::Binary)?
                .execute("", 0)?
                .bind("", ROLLBACK.0, &[], Format::Text)?
                .execute("", 0)?
                .bind("", RESET_AFTER_READ.0, &[text(&seed)], Format::Text)?
                .execute("", 0)?
                .sync();
            Ok::<(), WireError>(())
        })();
        if let Err(e) = encoded {
            // Nothing was sent: a parameter that cannot be sent as asked.
            return (Ok(Err(StaleOr::Error(self.map_wire(&e)))), Left::Clean);
        }
        let mut answers = match flight.send().await {
            Ok(answers) => answers,
            Err(e) => return (Ok(Err(StaleOr::Error(self.map_wire(&e)))), Left::Lost),
        };
        let limits = &self.limits;
        let mut writer = RowWriter::new(limits.max_result_bytes);
        result::header(
            out,
            statement
                .columns
                .iter()
                .map(|(name, ty)| (name.as_str(), ty.name())),
        );
        // Each statement's answer ends with its CommandComplete (or EmptyQuery): `step` counts
        // them, so an error names the statement it came from.
        let mut step = 0;
        let mut refused: Option<(usize, Box<sqlhttp_pgwire::DbError>)> = None;
        let mut changed = 0;
        loop {
            let answer = match answers.next().await {
                Ok(Some(answer)) => answer,
                Ok(None) => break,
                Err(e) => return (Ok(Err(StaleOr::Error(self.map_wire(&e)))), Left::Lost),
            };
            match answer {
                Answer::Row(row) if step == 1 => {
                    let position = row
                        .iter()
                        .nth(2)
                        .flatten()
                        .and_then(|lsn| std::str::from_utf8(lsn).ok())
                        .and_then(crate::protocol::bookmark::from_lsn);
                    match position {
                        Some(position) => {
                            lease.position.fetch_max(
                                position.position(),
                                std::sync::atomic::Ordering::AcqRel,
                            );
                        }
                        None => {
                            tracing::error!("the database did not name its log position");
                            return (Ok(Err(StaleOr::Error(ApiError::internal()))), Left::Lost);
                        }
                    }
                }
                Answer::Row(row) if step == 2 => {
                    let count = writer.rows();
                    if let Some((index, cell)) = row
                        .iter()
                        .enumerate()
                        .find(|(_, cell)| cell.is_some_and(|c| c.len() > limits.max_value_bytes))
                    {
                        let name = statement
                            .columns
                            .get(index)
                            .map_or("?", |(n, _)| n.as_str());
                        let bytes = cell.map_or(0, <[u8]>::len);
                        let err = value_too_big(name, count + 1, bytes, limits.max_value_bytes);
                        return self.give_up(lease, err).await;
                    }
                    writer.begin(out);
                    for (index, cell) in row.iter().enumerate() {
                        writer.cell(out, index);
                        let Some((name, ty)) = statement.columns.get(index) else {
                            writer.discard(out);
                            return self.give_up(lease, ApiError::internal()).await;
                        };
                        if let Err(why) = types::write_cell(out, ty, cell) {
                            writer.discard(out);
                            tracing::error!(column = name, error = %why, "cannot write a cell");
                            return self.give_up(lease, ApiError::internal()).await;
                        }
                        if let Err(err) = writer.check(out) {
                            return self.give_up(lease, err).await;
                        }
                    }
                    let count = writer.end(out);
                    if let Err(err) = sink.after_row(out, count).await {
                        return self.give_up(lease, err).await;
                    }
                }
                Answer::CommandComplete(done) => {
                    if step == 2 && tag::counts_changed_rows(&request.sql) {
                        changed = done
                            .as_str()
                            .rsplit(' ')
                            .next()
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(0);
                    }
                    step += 1;
                }
                Answer::EmptyQuery => step += 1,
                Answer::Error(e) => refused = Some((step, e)),
                // The reset's row (its function returns `void`).
                Answer::Row(_) if step == 4 => {}
                Answer::BindComplete | Answer::ReadyForQuery(_) | Answer::NoData => {}
                other => {
                    tracing::error!(?other, "an unexpected answer in a read's flight");
                    return (Ok(Err(StaleOr::Error(ApiError::internal()))), Left::Lost);
                }
            }
        }
        let Some((at, refusal)) = refused else {
            return (Ok(Ok(changed)), left_by(&flights.connection));
        };
        if at >= 3 {
            // The read is whole (a read keeps nothing, whatever its end did); the session is
            // closed, not pooled (a client's function may have deallocated the server's
            // statements: `DEALLOCATE ALL` through dynamic SQL).
            tracing::warn!(error = %refusal, "cannot end or reset a read's session; closing it");
            return (Ok(Ok(changed)), Left::Unreset);
        }
        // PostgreSQL skipped to the Sync: the end and the reset go in a flight of their own.
        let left = end_and_reset(&mut flights.connection).await;
        if at == 2 && cached && is_stale(&refusal.code) && !sink.started() {
            flights.statements.remove(sql);
            return (Ok(Err(Stale)), left);
        }
        let err = if at < 2 && refusal.code == "26000" {
            // A client's function deallocated the server's statements: prepare them again.
            flights.prepared = false;
            flights.statements.clear();
            ApiError::unavailable(
                "the database session lost the statements the server prepared on it (a \
                 function deallocated them); nothing of the request ran: retry",
            )
        } else {
            self.map_refusal(&refusal)
        };
        (Ok(Err(StaleOr::Error(err))), left)
    }

    /// The answer for a flight whose rows are not read to their end (a cell or row past its
    /// bound, a body nobody reads): its statement is cancelled, and the session lost.
    async fn give_up(
        &self,
        lease: &Lease,
        err: ApiError,
    ) -> (Result<Result<u64, StaleOr>, Fallback>, Left) {
        lease.cancel_statement().await;
        (Ok(Err(StaleOr::Error(err))), Left::Lost)
    }

    /// The protocol error for a failure of the flights' connection.
    fn map_wire(&self, err: &WireError) -> ApiError {
        match err {
            WireError::Db(db) => self.map_refusal(db),
            WireError::Fatal(db) => {
                let mapped = errors::map_db_error(db.as_ref(), self.timeout_ms());
                if mapped.code == ErrorCode::Unavailable {
                    return self.closing_or(mapped);
                }
                self.closing_or(ApiError::outage(
                    "the connection to the database was lost; retry later",
                ))
            }
            WireError::Invalid(why) => {
                ApiError::sql(format!("the statement cannot be sent: {why}"))
            }
            WireError::TooLarge { tag: b'D', .. } => {
                ApiError::row_too_large(self.limits.max_result_bytes, 1)
            }
            WireError::TooLarge { tag, declared, .. } => ApiError::new(
                ErrorCode::ResultTooLarge,
                format!(
                    "PostgreSQL sent a message (type `{}`) of {declared} bytes, more than this \
                     server takes for one (--max-result-bytes): a notice or error text that \
                     long is not carried",
                    char::from(*tag).escape_default()
                ),
            ),
            other => {
                tracing::warn!(error = %other, "a flight failed");
                self.closing_or(ApiError::outage(
                    "the connection to the database was lost; retry later",
                ))
            }
        }
    }

    /// The protocol error for PostgreSQL's refusal of a statement in a flight.
    fn map_refusal(&self, db: &sqlhttp_pgwire::DbError) -> ApiError {
        self.closing_or(errors::map_db_error(db, self.timeout_ms()))
    }

    /// Once closing, a cancelled or lost statement is the shutdown's 503 (as [`Inner::map`]).
    fn closing_or(&self, mapped: ApiError) -> ApiError {
        if self.closing.load(std::sync::atomic::Ordering::Acquire)
            && matches!(
                mapped.code,
                ErrorCode::StatementTimeout | ErrorCode::Unavailable
            )
        {
            return crate::engine::shutting_down();
        }
        mapped
    }
}

/// A try that sent nothing for the request: the driver runs it.
struct Fallback;

/// A try's failure: a cached statement that went stale (run again, prepared afresh), or the
/// answer.
enum StaleOr {
    Stale,
    Error(ApiError),
}

use StaleOr::Stale;

impl StaleOr {
    fn into_error(self) -> ApiError {
        match self {
            Stale => ApiError::unavailable(
                "a prepared statement went stale (the schema changed) and the request could not \
                 run again; retry",
            ),
            StaleOr::Error(err) => err,
        }
    }
}

/// Whether a cached statement's refusal is one a fresh Parse may not get (see `exec::is_stale`;
/// flights run on the primary only, where no `0A000` is a replica's).
fn is_stale(code: &str) -> bool {
    code == "0A000" || code == "26000" || code.starts_with("42")
}

/// What a flight read to its end (or not) leaves of the session.
fn left_by(connection: &Connection<Lent>) -> Left {
    if connection.is_in_doubt() {
        Left::Lost
    } else if connection.transaction_status() == TransactionStatus::Idle {
        Left::Clean
    } else {
        Left::Unreset
    }
}

/// The end and the reset after a flight PostgreSQL skipped to its `Sync`.
async fn end_and_reset(connection: &mut Connection<Lent>) -> Left {
    let seed = seed();
    let sent = async {
        let mut flight = connection.flight()?;
        flight
            .bind("", ROLLBACK.0, &[], Format::Text)?
            .execute("", 0)?
            .bind("", RESET_AFTER_READ.0, &[text(&seed)], Format::Text)?
            .execute("", 0)?
            .sync();
        flight.send().await?.finish().await
    };
    match sent.await {
        Ok(TransactionStatus::Idle) => Left::Clean,
        Ok(_) => Left::Unreset,
        Err(e) => {
            tracing::warn!(error = %e, "cannot end or reset a read's session; closing it");
            left_by(connection)
        }
    }
}

/// Prepares the server's statements on the session, in one flight.
async fn prepare_fixed(connection: &mut Connection<Lent>) -> Result<(), WireError> {
    let mut flight = connection.flight()?;
    for (name, sql) in FIXED {
        flight.parse(name, sql, &[])?;
    }
    flight.sync();
    flight.send().await?.finish().await.map(drop)
}

impl Flights {
    /// The client statement `sql`, from the cache or prepared and described now; `None` when
    /// flights cannot run it (a parameter or column of a type outside the built-in ones).
    async fn statement(&mut self, sql: &str) -> Result<Option<Arc<Statement>>, WireError> {
        if let Some(known) = self.statements.get(sql) {
            return Ok(known.clone());
        }
        if self.statements.len() >= CACHED_STATEMENTS {
            self.forget_statements().await?;
        }
        self.next += 1;
        let name = format!("_sqlhttp_f{}", self.next);
        let described = self.connection.describe(&name, sql, &[]).await?;
        let params: Option<Vec<Type>> = described
            .params
            .iter()
            .map(|&oid| Type::from_oid(oid))
            .collect();
        let columns: Option<Vec<(String, Type)>> = described
            .columns
            .iter()
            .map(|column| Some((column.name.clone(), Type::from_oid(column.type_oid)?)))
            .collect();
        let statement = params.zip(columns).map(|(params, columns)| {
            Arc::new(Statement {
                name,
                params,
                columns,
            })
        });
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Closes every cached statement on the session, in one flight.
    async fn forget_statements(&mut self) -> Result<(), WireError> {
        let names: Vec<String> = self
            .statements
            .drain()
            .filter_map(|(_, statement)| statement.map(|s| s.name.clone()))
            .collect();
        let mut flight = self.connection.flight()?;
        for name in &names {
            flight.close_statement(name)?;
        }
        flight.sync();
        flight.send().await?.finish().await.map(drop)
    }
}

/// A parameter as flights send it.
fn param<'a>(bound: &'a Bound<'_>) -> Param<'a> {
    match bound {
        Bound::Null => Param {
            format: Format::Text,
            value: None,
        },
        Bound::Text(text) => Param {
            format: Format::Text,
            value: Some(text.as_bytes()),
        },
        Bound::Bytes(bytes) => Param {
            format: Format::Binary,
            value: Some(bytes),
        },
    }
}

fn text(value: &str) -> Param<'_> {
    Param {
        format: Format::Text,
        value: Some(value.as_bytes()),
    }
}

/// The random seed of a read's reset (see `session::after_read`).
fn seed() -> String {
    format!("{:?}", rand::random::<f64>().mul_add(2.0, -1.0))
}
