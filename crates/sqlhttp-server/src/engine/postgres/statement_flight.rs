//! What every flight that runs one client statement shares, a verified read's (`read_flight`)
//! and a write's (`write_flight`): the statement's text checked and rewritten, the session lent
//! by the driver, the statement found in the connection's cache or prepared inside the
//! transaction it will run in (so its Parse waits for locks no longer than the statement would),
//! its parameters checked and bound, and its rows written from the `DataRow`'s bytes straight
//! into the shared result writer through `types::write_cell`, bounded as `exec` bounds them (a
//! message past the row bound is refused from its header by `sqlhttp-pgwire`'s `Limits`).
//!
//! Knows the statement, its rows and the mapping of PostgreSQL's refusals; nothing about how a
//! transaction ends, HTTP, pooling or replicas.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sqlhttp_pgwire::{Answer, Answers, DbError, Error as WireError, Format, Param, Row, RowPast};
use tokio_postgres::types::Type;

use crate::config::Limits;
use crate::engine::postgres::exec::value_too_big;
use crate::engine::postgres::flights::{self, Flights, Left, Lookup, Opening, Statement, text};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::placeholders::Rewritten;
use crate::engine::postgres::transaction::Opened;
use crate::engine::postgres::types::{self, Bound};
use crate::engine::postgres::wire::{Lent, Loan, SLACK};
use crate::engine::postgres::{Inner, errors, tag};
use crate::engine::stream::Sink;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::protocol::result::{self, RowWriter};

/// What one try of a statement's flights came to.
pub(super) enum Tried {
    /// The statement's answer.
    Done(Result<u64, ApiError>),
    /// Nothing of it ran to an answer, and nothing was sent: run it once more, prepared afresh
    /// (a cached statement went stale, the server's statements went missing).
    Again,
    /// Nothing of it ran: the driver runs it.
    Driver,
}

/// A statement ready to be bound in a flight: prepared on the session, its parameters checked.
pub(super) struct Ready<'r> {
    pub(super) statement: Arc<Statement>,
    /// Found in the cache: it may have gone stale. Else this try prepared it, in the
    /// transaction it opened, which is open now.
    pub(super) cached: bool,
    pub(super) bound: Vec<Bound<'r>>,
}

/// The rewritten text of `request`'s statement, as flights send it, once it passed the text
/// checks (or passed them before: `texts`) and names as many parameters as the request gives.
pub(super) fn checked_sql(inner: &Inner, request: &SqlRequest) -> Result<Arc<Rewritten>, ApiError> {
    let rewritten = inner.texts.checked(&request.sql)?;
    rewritten.check_bound(request.params.len())?;
    Ok(rewritten)
}

/// The session lent to `flights` by the driver, `None` when it cannot be now (then the driver
/// runs the statement: see `wire::Wire::lend_soon`).
pub(super) async fn lend(flights: &Flights) -> Option<Loan> {
    let wire = flights.wire.upgrade()?;
    wire.lend_soon().await
}

/// The statement timeout and lock timeout of a request's transaction in milliseconds, as
/// the texts of the settings statement's two parameters.
pub(super) fn flight_timeouts(inner: &Inner) -> [String; 2] {
    [
        inner.timeout_ms().to_string(),
        inner.lock_wait_ms().to_string(),
    ]
}

/// `sql`, `request`'s statement, prepared on the session and bound: from the cache, or
/// prepared in the transaction `opening` opens (then open on return). `Err` with what the
/// try came to when it cannot run in a flight: any transaction it opened has ended then.
pub(super) async fn prepared<'r>(
    inner: &Inner,
    flights: &mut Flights,
    lease: &Lease,
    request: &'r SqlRequest,
    sql: &str,
    opening: Opening<'_>,
) -> Result<Ready<'r>, (Tried, Left)> {
    if !flights.prepared
        && let Err(e) = flights.prepare_fixed().await
    {
        tracing::warn!(error = %e, "cannot prepare the server's statements for flights");
        return Err(match flights::left_by(&flights.connection) {
            Left::Lost => (Tried::Done(Err(map_wire(inner, &e))), Left::Lost),
            left => (Tried::Driver, left),
        });
    }
    let (statement, cached) = match flights.lookup(sql) {
        Lookup::Ready(statement) => (statement, true),
        Lookup::Driver => return Err((Tried::Driver, Left::Clean)),
        Lookup::Unknown(name) => {
            match open_and_prepare(inner, flights, lease, sql, name, opening).await? {
                Some(statement) => (statement, false),
                None => {
                    return Err((Tried::Driver, flights::end_opened(flights, opening).await));
                }
            }
        }
    };
    // From here a statement prepared by this try (`!cached`) runs in the transaction its
    // preparation opened, which a refusal here must end.
    let refuse = |err: ApiError| Tried::Done(Err(err));
    let refused = if statement.params.len() == request.params.len() {
        statement
            .columns
            .iter()
            .find(|(_, ty)| !types::is_supported(ty))
            .map(|(name, ty)| refuse(types::unsupported(name, ty)))
    } else {
        Some(refuse(ApiError::sql(format!(
            "wrong number of parameters: the statement takes {}, the request gave {}",
            statement.params.len(),
            request.params.len()
        ))))
    };
    let bound = match refused {
        Some(refused) => Err(refused),
        None => match types::bind(&request.params, &statement.params) {
            Ok(bound) => Ok(bound),
            // The cached statement's types may be older than the schema: a fresh one
            // decides.
            Err(_) if cached => {
                flights.forget(sql);
                Err(Tried::Again)
            }
            Err(err) => Err(refuse(err)),
        },
    };
    match bound {
        Ok(bound) => Ok(Ready {
            statement,
            cached,
            bound,
        }),
        Err(tried) if cached => Err((tried, Left::Clean)),
        Err(tried) => Err((tried, flights::end_opened(flights, opening).await)),
    }
}

/// Opens the request's transaction as `opening` says and prepares the client's statement
/// `sql` as `name` in it, in one flight: `Ok(None)` when flights do not run it (the
/// transaction is open), `Err` with what the try came to when PostgreSQL refused it (the
/// transaction ended).
async fn open_and_prepare(
    inner: &Inner,
    flights: &mut Flights,
    lease: &Lease,
    sql: &str,
    name: String,
    opening: Opening<'_>,
) -> Result<Option<Arc<Statement>>, (Tried, Left)> {
    let [timeout, lock_wait] = flight_timeouts(inner);
    let settings = [text(&timeout), text(&lock_wait)];
    let lost = |e: WireError| (Tried::Done(Err(map_wire(inner, &e))), Left::Lost);
    if let Opening::Write { .. } = opening {
        flights.unnamed_replaced();
    }
    let Some(mut flight) = flights.flight() else {
        return Err((Tried::Done(Err(ApiError::internal())), Left::Lost));
    };
    let encoded = (|| {
        opening.add(&mut flight, &settings)?;
        flight
            .parse(&name, sql, &[])?
            .describe_statement(&name)?
            .sync();
        Ok::<(), WireError>(())
    })();
    if let Err(e) = encoded {
        // Nothing was sent: the statement's text cannot be (a NUL byte in it).
        return Err((Tried::Done(Err(map_wire(inner, &e))), Left::Clean));
    }
    let mut answers = flight.send().await.map_err(lost)?;
    let (mut step, mut learnt) = (0, false);
    let (mut params, mut columns, mut refused) = (None, None, None);
    while let Some(answer) = answers.next().await.map_err(lost)? {
        match answer {
            Answer::Row(row) if step == 1 => learnt = learn(lease, opening, &row),
            Answer::CommandComplete(_) => step += 1,
            Answer::ParameterDescription(types) => params = Some(types),
            Answer::RowDescription(described) => {
                columns = Some(described.to_vec().map_err(lost)?);
            }
            Answer::NoData => columns = Some(Vec::new()),
            Answer::Error(e) => refused = Some((step, e)),
            Answer::ParseComplete
            | Answer::BindComplete
            | Answer::CloseComplete
            | Answer::ReadyForQuery(_) => {}
            other => return Err(unexpected(&other)),
        }
    }
    flights.closed();
    if let Some((at, refusal)) = refused {
        let left = flights::end_opened(flights, opening).await;
        if at < 2 && refusal.code == "26000" {
            flights.lost_statements();
            return Err((Tried::Again, left));
        }
        return Err((Tried::Done(Err(map_refusal(inner, &refusal))), left));
    }
    let (Some(params), Some(columns), true) = (params, columns, learnt) else {
        tracing::error!("a statement's preparation was answered without all it asks for");
        return Err((Tried::Done(Err(ApiError::internal())), Left::Lost));
    };
    Ok(flights.keep(sql, name, &params, &columns))
}

/// Keeps what the settings' row of `opening` names (its third cell): a read's log position
/// (a `pg_lsn`'s text) as the request's, a write's transaction start for its COMMIT's
/// check. Whether it named it.
pub(super) fn learn(lease: &Lease, opening: Opening<'_>, row: &Row) -> bool {
    let third = row
        .iter()
        .nth(2)
        .flatten()
        .and_then(|cell| std::str::from_utf8(cell).ok());
    match opening {
        Opening::Read => match third.and_then(crate::protocol::bookmark::from_lsn) {
            Some(position) => {
                lease
                    .position
                    .fetch_max(position.position(), Ordering::AcqRel);
                true
            }
            None => false,
        },
        Opening::Write { .. } => match third.and_then(|at| Opened::checked(at.to_owned())) {
            Some(opened) => {
                *lease
                    .opened
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(opened);
                true
            }
            None => false,
        },
    }
}

/// The answer for a flight whose rows are not read to their end (a cell or row past its
/// bound, a body nobody reads): its statement is cancelled, and the session lost.
pub(super) async fn give_up(lease: &Lease, err: ApiError) -> (Tried, Left) {
    lease.cancel_statement().await;
    (Tried::Done(Err(err)), Left::Lost)
}

/// The protocol error for a failure of the flights' connection.
pub(super) fn map_wire(inner: &Inner, err: &WireError) -> ApiError {
    match err {
        WireError::Db(db) | WireError::Fatal(db) => map_refusal(inner, db),
        WireError::Invalid(why) => ApiError::sql(format!("the statement cannot be sent: {why}")),
        WireError::TooLarge { tag, declared, .. } => ApiError::new(
            ErrorCode::ResultTooLarge,
            format!(
                "PostgreSQL sent a message (type `{}`) of {} bytes, more than this server \
                 takes for one (--max-result-bytes): a notice or error text that long is not \
                 carried",
                char::from(*tag).escape_default(),
                declared.saturating_sub(5)
            ),
        ),
        other => {
            tracing::warn!(error = %other, "a flight failed");
            closing_or(
                inner,
                ApiError::outage("the connection to the database was lost; retry later"),
            )
        }
    }
}

/// The protocol error for PostgreSQL's refusal of a statement in a flight.
pub(super) fn map_refusal(inner: &Inner, db: &DbError) -> ApiError {
    closing_or(inner, errors::map_db_error(db, inner.timeout_ms()))
}

/// Once closing, a cancelled or lost statement is the shutdown's 503 (as [`Inner::map`]).
fn closing_or(inner: &Inner, mapped: ApiError) -> ApiError {
    if inner.closing.load(Ordering::Acquire)
        && matches!(
            mapped.code,
            ErrorCode::StatementTimeout | ErrorCode::Unavailable
        )
    {
        return crate::engine::shutting_down();
    }
    mapped
}

/// The client statement's rows as a flight reads them, written into the result writer.
pub(super) struct ClientRows<'s> {
    columns: &'s [(String, Type)],
    writer: RowWriter,
}

impl<'s> ClientRows<'s> {
    /// Starts the body of `statement`'s rows in `out` with its columns.
    pub(super) fn start(statement: &'s Statement, limits: &Limits, out: &mut Vec<u8>) -> Self {
        result::header(
            out,
            statement
                .columns
                .iter()
                .map(|(name, ty)| (name.as_str(), ty.name())),
        );
        ClientRows {
            columns: &statement.columns,
            writer: RowWriter::new(limits.max_result_bytes),
        }
    }

    /// The answer for the next row, whose message of `declared` bytes `answers` refused from its
    /// header: where the row passes its bounds, read from its cells' lengths as they arrive
    /// (its cells never held), answered as the driver's path answers such a cell or row.
    pub(super) async fn too_large(
        &self,
        answers: &mut Answers<'_, Lent>,
        declared: usize,
        limits: &Limits,
    ) -> ApiError {
        let row = self.writer.rows() + 1;
        let past = answers
            .row_past_bounds(
                limits.max_value_bytes,
                limits.max_result_bytes.saturating_add(SLACK),
            )
            .await;
        match past {
            Ok(RowPast::Cell { index, bytes }) => {
                let fallback = format!("{}", index + 1);
                let name = self
                    .columns
                    .get(index)
                    .map_or(fallback.as_str(), |(name, _)| name.as_str());
                value_too_big(name, row, bytes, limits.max_value_bytes)
            }
            Ok(RowPast::Row) => ApiError::row_too_large(limits.max_result_bytes, row),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read where a refused row passes its bounds");
                match self.columns {
                    [(name, _)] => value_too_big(
                        name,
                        row,
                        declared.saturating_sub(11),
                        limits.max_value_bytes,
                    ),
                    _ => ApiError::row_too_large(limits.max_result_bytes, row),
                }
            }
        }
    }

    /// Writes `row` into `out` and hands what is whole to `sink`. `Err`: the row cannot be
    /// answered (a cell or the row past its bound, a body nobody reads), and the flight is to
    /// be given up.
    pub(super) async fn write(
        &mut self,
        row: &Row,
        limits: &Limits,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> Result<(), ApiError> {
        if row.len() != self.columns.len() {
            tracing::error!("a row's cells are not its statement's columns");
            return Err(ApiError::internal());
        }
        let count = self.writer.rows();
        if let Some((index, bytes)) = row
            .iter()
            .map(|cell| cell.map_or(0, <[u8]>::len))
            .enumerate()
            .find(|&(_, bytes)| bytes > limits.max_value_bytes)
        {
            let name = &self.columns[index].0;
            return Err(value_too_big(
                name,
                count + 1,
                bytes,
                limits.max_value_bytes,
            ));
        }
        self.writer.begin(out);
        for (index, (cell, (name, ty))) in row.iter().zip(self.columns).enumerate() {
            self.writer.cell(out, index);
            if let Err(why) = types::write_cell(out, ty, cell) {
                self.writer.discard(out);
                tracing::error!(column = name, error = %why, "cannot write a cell");
                return Err(ApiError::internal());
            }
            self.writer.check(out)?;
        }
        let count = self.writer.end(out);
        sink.after_row(out, count).await
    }
}

/// The rows a statement's end says it changed, when its text is one that counts them.
pub(super) fn changed(request: &SqlRequest, done: &sqlhttp_pgwire::Tag) -> u64 {
    if !tag::counts_changed_rows(&request.sql) {
        return 0;
    }
    done.as_str()
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The answer when a statement went stale again on its second run.
pub(super) fn stale() -> ApiError {
    ApiError::unavailable(
        "a prepared statement went stale (the schema changed) and the request could not run \
         again; retry",
    )
}

/// An answer a flight does not ask for: the session is out of step.
pub(super) fn unexpected(answer: &Answer) -> (Tried, Left) {
    tracing::error!(?answer, "an unexpected answer in a statement's flight");
    (Tried::Done(Err(ApiError::internal())), Left::Lost)
}

/// Whether a cached statement's refusal is one a fresh Parse may not get (see `exec::is_stale`;
/// flights run on the primary only, where no `0A000` is a replica's).
pub(super) fn is_stale(code: &str) -> bool {
    code == "0A000" || code == "26000" || code.starts_with("42")
}

/// A parameter as flights send it.
pub(super) fn param<'a>(bound: &'a Bound<'_>) -> Param<'a> {
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

/// Whether a try that came to `tried` and left `left` runs once more: a stale statement's first
/// try, nothing of its body sent, its session clean. Its `out` is cleared then. Else what it
/// came to, a second stale try answered as [`stale`].
pub(super) fn once_more(
    tried: Tried,
    left: Left,
    again: &mut bool,
    started: bool,
    out: &mut Vec<u8>,
) -> Option<Tried> {
    match tried {
        Tried::Again if *again && !started && left == Left::Clean => {
            tracing::debug!("a statement went stale; running it again");
            *again = false;
            out.clear();
            None
        }
        Tried::Again => Some(Tried::Done(Err(stale()))),
        other => Some(other),
    }
}

/// Gives the session back to the driver as the last try `left` it, with `tried`'s answer and
/// whether the session may serve again; `None` when the driver is to run the statement (nothing
/// of it ran).
pub(super) fn settle(
    lease: &Lease,
    flights: Flights,
    loan: Loan,
    tried: Tried,
    left: Left,
) -> Option<(Result<u64, ApiError>, bool)> {
    let tried = match (tried, left) {
        // The driver must not run it on a session whose end failed.
        (Tried::Driver, Left::Unreset) => Tried::Done(Err(ApiError::unavailable(
            "the database session could not be reset after a request; retry",
        ))),
        (tried, _) => tried,
    };
    match left {
        Left::Clean => {}
        Left::Unreset => lease.retire(),
        Left::Lost => {
            // The loan goes unreturned: the driver's connection ends too.
            drop(loan);
            let answer = match tried {
                Tried::Done(answer) => answer,
                // Nothing of it ran, or what ran was rolled back.
                Tried::Again | Tried::Driver => Err(ApiError::unavailable(
                    "the database session was lost before the request could run; retry",
                )),
            };
            return Some((answer, false));
        }
    }
    loan.give_back();
    lease.keep_flights(flights);
    match tried {
        Tried::Done(answer) => Some((answer, true)),
        Tried::Again | Tried::Driver => None,
    }
}
