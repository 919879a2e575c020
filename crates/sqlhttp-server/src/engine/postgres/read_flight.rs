//! A verified read on the primary in ONE flight of the extended protocol (ADR 0061): `BEGIN READ
//! ONLY`, its settings with the log position, the client's statement with its rows in binary,
//! `ROLLBACK` and the session's reset after a read, then one `Sync`. A statement the connection
//! has not prepared yet takes one flight more, first, inside the same transaction (so its
//! Parse waits for locks no longer than the statement would): `BEGIN`, the settings, its Parse
//! and Describe.
//!
//! Rows go from the `DataRow`'s bytes straight into the shared result writer through
//! `types::write_cell`, bounded as `exec` bounds them; a message past the row bound is refused
//! from its header (`sqlhttp-pgwire`'s `Limits`). When PostgreSQL refuses anything in a flight it
//! skips to the `Sync`: the end and the reset then go in a flight of their own (`flights`). A
//! cached statement refused as stale, or the server's statements gone, run the read once more,
//! prepared afresh, when nothing of its body was sent. A flight given up with answers unread
//! loses the session for the driver too (it is closed, and its statement cancelled).
//!
//! Knows the read's answers and the result writer; nothing about HTTP, pooling or replicas.

use sqlhttp_pgwire::{Answer, DbError, Error as WireError, Format, Param};

use crate::engine::postgres::flights::{self, Flights, Left, Opening, Statement, left_by, text};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::statement_flight;
use crate::engine::postgres::statement_flight::{
    self as statement, ClientRows, Ready, Tried, changed, is_stale, once_more, param, settle,
    unexpected,
};
use crate::engine::postgres::{Inner, session};
use crate::engine::stream::Sink;
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

/// Where each statement's answer is in a read's flight: counted by the statements' ends
/// (`CommandComplete`, `EmptyQueryResponse`), so an error or a row names its statement.
struct Steps {
    /// The settings' row (its position), when this flight opened the transaction.
    settings: Option<usize>,
    client: usize,
}

/// Runs `request`, a verified read on the primary, on `lease` in one flight, writing its
/// body into `out` and `sink` as `exec::write_rows` does, and returns the rows it changed
/// (0) with whether the session may serve again. `None` when flights cannot run it here
/// and nothing was sent for it: the caller runs it through the driver.
pub(super) async fn read_in_one_flight(
    inner: &Inner,
    lease: &Lease,
    request: &SqlRequest,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
) -> Option<(Result<u64, ApiError>, bool)> {
    let mut flights = lease.take_flights()?;
    let checked = match statement::checked_sql(inner, request) {
        Ok(checked) => checked,
        Err(err) => {
            lease.keep_flights(flights);
            return Some((Err(err), true));
        }
    };
    let Some(loan) = statement::lend(&flights).await else {
        lease.keep_flights(flights);
        return None;
    };
    let sql = checked.sql.as_str();
    let mut again = true;
    loop {
        let (tried, left) = try_read(inner, &mut flights, lease, request, sql, out, sink).await;
        if let Some(tried) = once_more(tried, left, &mut again, sink.started(), out) {
            return settle(lease, flights, loan, tried, left);
        }
    }
}

/// One try of [`read_in_one_flight`]: what it came to and what it left.
async fn try_read(
    inner: &Inner,
    flights: &mut Flights,
    lease: &Lease,
    request: &SqlRequest,
    sql: &str,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
) -> (Tried, Left) {
    let ready = match statement_flight::prepared(inner, flights, lease, request, sql, Opening::Read)
        .await
    {
        Ok(ready) => ready,
        Err(tried) => return tried,
    };
    run_read(inner, flights, lease, request, sql, &ready, out, sink).await
}

/// Sends the read's flight (its transaction opened unless its statement was prepared by
/// this try, in the transaction it opened) and writes its rows.
#[expect(
    clippy::too_many_arguments,
    reason = "one read's parts, handed over from its try"
)]
async fn run_read(
    inner: &Inner,
    flights: &mut Flights,
    lease: &Lease,
    request: &SqlRequest,
    sql: &str,
    ready: &Ready<'_>,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
) -> (Tried, Left) {
    let Ready {
        statement,
        cached,
        bound,
    } = ready;
    let (statement, cached): (&Statement, bool) = (statement, *cached);
    let params: Vec<Param<'_>> = bound.iter().map(param).collect();
    let opened = !cached;
    let [timeout, lock_wait] = statement_flight::flight_timeouts(inner);
    let settings = [text(&timeout), text(&lock_wait)];
    let seed = session::seed();
    let parse_reset = flights.reset_to_parse();
    let lost = |e: &WireError| {
        (
            Tried::Done(Err(statement_flight::map_wire(inner, e))),
            Left::Lost,
        )
    };
    let Some(mut flight) = flights.flight() else {
        return (Tried::Done(Err(ApiError::internal())), Left::Lost);
    };
    let encoded = (|| {
        if !opened {
            Opening::Read.add(&mut flight, &settings)?;
        }
        flight
            .bind("", &statement.name, &params, Format::Binary)?
            .execute("", 0)?;
        flights::add_end(&mut flight, &seed, parse_reset)?;
        flight.sync();
        Ok::<(), WireError>(())
    })();
    if let Err(e) = encoded {
        // Nothing was sent (a parameter that cannot be): end what the preparation opened.
        let left = if opened {
            flights::end_and_reset(flights).await
        } else {
            Left::Clean
        };
        return (
            Tried::Done(Err(statement_flight::map_wire(inner, &e))),
            left,
        );
    }
    let steps = if opened {
        Steps {
            settings: None,
            client: 0,
        }
    } else {
        Steps {
            settings: Some(1),
            client: Opening::Read.statements(),
        }
    };
    let mut answers = match flight.send().await {
        Ok(answers) => answers,
        Err(e) => return lost(&e),
    };
    let limits = &inner.limits;
    let mut rows = ClientRows::start(statement, limits, out);
    let (mut step, mut changed_rows) = (0, 0);
    // The reset answers one row and `SELECT 1`; anything else ran in its place (the unnamed
    // statement was not the reset), and the session is closed rather than trusted.
    let (mut reset_rows, mut reset_done) = (0, false);
    let mut positioned = opened;
    let mut refused: Option<(usize, Box<DbError>)> = None;
    // The client's statement was bound: see `write_flight`'s stale rule.
    let mut bound = false;
    loop {
        let answer = match answers.next().await {
            Ok(Some(answer)) => answer,
            Ok(None) => break,
            Err(WireError::TooLarge {
                tag: b'D',
                declared,
                ..
            }) if step == steps.client => {
                let err = rows.too_large(&mut answers, declared, limits).await;
                return statement_flight::give_up(lease, err).await;
            }
            Err(e) => return lost(&e),
        };
        match answer {
            Answer::Row(row) if Some(step) == steps.settings => {
                positioned = statement_flight::learn(lease, Opening::Read, &row);
            }
            Answer::Row(row) if step == steps.client => {
                if let Err(err) = rows.write(&row, limits, out, sink).await {
                    return statement_flight::give_up(lease, err).await;
                }
            }
            // A row where `ROLLBACK` stands: a client's function took its name over, and
            // the transaction it leaves open closes the session (`left_by`).
            Answer::Row(_) if step == steps.client + 1 => {}
            // The reset's row (its function returns `void`).
            Answer::Row(_) if step == steps.client + 2 => reset_rows += 1,
            Answer::CommandComplete(done) => {
                if step == steps.client + 2 {
                    reset_done = done.as_str() == "SELECT 1" && reset_rows == 1;
                }
                if step == steps.client {
                    changed_rows = changed(request, &done);
                }
                step += 1;
            }
            Answer::EmptyQuery => step += 1,
            Answer::Error(e) => refused = Some((step, e)),
            Answer::BindComplete if step == steps.client => bound = true,
            Answer::ParseComplete
            | Answer::BindComplete
            | Answer::CloseComplete
            | Answer::ReadyForQuery(_) => {}
            other => return unexpected(&other),
        }
    }
    flights.closed();
    if parse_reset {
        flights.reset_parsed(refused.is_none() && reset_done);
    }
    let Some((at, refusal)) = refused else {
        if !positioned {
            tracing::error!("the database did not name its log position");
            return (Tried::Done(Err(ApiError::internal())), Left::Lost);
        }
        if !reset_done {
            tracing::error!("a read's reset was not answered as the reset; closing the session");
            return (Tried::Done(Ok(changed_rows)), Left::Unreset);
        }
        return (Tried::Done(Ok(changed_rows)), left_by(&flights.connection));
    };
    if at > steps.client {
        // The read is whole (a read keeps nothing, whatever its end did); the session is
        // closed, not pooled.
        tracing::warn!(error = %refusal, "cannot end or reset a read's session; closing it");
        return (Tried::Done(Ok(changed_rows)), Left::Unreset);
    }
    let left = flights::end_and_reset(flights).await;
    // Stale only when refused at Bind, where PostgreSQL checks a cached plan against the
    // schema: a statement that was bound runs against the schema it was planned for, so its
    // error is the client's own (a function that raised `42501`), not to be answered as a
    // stale statement or run again.
    if at == steps.client && cached && !bound && is_stale(&refusal.code) {
        flights.forget(sql);
        return (Tried::Again, left);
    }
    if at < steps.client && refusal.code == "26000" {
        // A client's function deallocated the server's statements.
        flights.lost_statements();
        return (Tried::Again, left);
    }
    (
        Tried::Done(Err(statement_flight::map_refusal(inner, &refusal))),
        left,
    )
}
