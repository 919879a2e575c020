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

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sqlhttp_pgwire::{Answer, DbError, Error as WireError, Format, Param};

use crate::engine::postgres::exec::value_too_big;
use crate::engine::postgres::flights::{
    self, BEGIN_READ, Flights, Left, Lookup, SETTINGS, Statement, left_by, text,
};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::types::{self, Bound};
use crate::engine::postgres::{Inner, errors, placeholders, sandbox, session, tag};
use crate::engine::stream::Sink;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::protocol::result::{self, RowWriter};

/// What one try of a read came to.
enum Tried {
    /// The read's answer.
    Done(Result<u64, ApiError>),
    /// Nothing of it ran to an answer, and nothing was sent: run it once more, prepared afresh
    /// (a cached statement went stale, the server's statements went missing).
    Again,
    /// Nothing of it ran: the driver runs it.
    Driver,
}

/// Where each statement's answer is in a read's flight: counted by the statements' ends
/// (`CommandComplete`, `EmptyQueryResponse`), so an error or a row names its statement.
struct Steps {
    /// The settings' row (its position), when this flight opened the transaction.
    settings: Option<usize>,
    client: usize,
}

impl Inner {
    /// The read's `statement_timeout` and `lock_timeout` in milliseconds, as the texts of
    /// the settings statement's two parameters.
    fn read_timeouts(&self) -> [String; 2] {
        [
            self.timeout_ms().to_string(),
            self.lock_wait_ms().to_string(),
        ]
    }

    /// Runs `request`, a verified read on the primary, on `lease` in one flight, writing its
    /// body into `out` and `sink` as `exec::write_rows` does, and returns the rows it changed
    /// (0) with whether the session may serve again. `None` when flights cannot run it here
    /// and nothing was sent for it: the caller runs it through the driver.
    pub(super) async fn read_in_one_flight(
        &self,
        lease: &Lease,
        request: &SqlRequest,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> Option<(Result<u64, ApiError>, bool)> {
        let mut flights = lease.take_flights()?;
        let checked = sandbox::check_text(&request.sql).map(|()| {
            let rewritten = placeholders::rewrite(&request.sql);
            let bound = rewritten.check_bound(request.params.len());
            (rewritten, bound)
        });
        let rewritten = match checked {
            Ok((rewritten, Ok(()))) => rewritten,
            Ok((_, Err(err))) | Err(err) => {
                lease.keep_flights(flights);
                return Some((Err(err), true));
            }
        };
        let wire = flights.wire.upgrade();
        let lent = match &wire {
            Some(wire) => wire.lend_soon().await,
            None => None,
        };
        let Some(loan) = lent else {
            lease.keep_flights(flights);
            return None;
        };
        let mut again = true;
        loop {
            let (tried, left) = self
                .try_read(&mut flights, lease, request, &rewritten.sql, out, sink)
                .await;
            let tried = match tried {
                Tried::Again if again && !sink.started() => {
                    tracing::debug!("a read's statements went stale; running it again");
                    again = false;
                    out.clear();
                    if left == Left::Clean {
                        continue;
                    }
                    Tried::Done(Err(stale()))
                }
                Tried::Again => Tried::Done(Err(stale())),
                other => other,
            };
            let tried = match (tried, left) {
                // The driver must not run it on a session whose end failed.
                (Tried::Driver, Left::Unreset) => Tried::Done(Err(ApiError::unavailable(
                    "the database session could not be reset after a read; retry",
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
                        Tried::Again | Tried::Driver => Err(ApiError::internal()),
                    };
                    return Some((answer, false));
                }
            }
            loan.give_back();
            lease.keep_flights(flights);
            return match tried {
                Tried::Done(answer) => Some((answer, true)),
                Tried::Again | Tried::Driver => None,
            };
        }
    }

    /// One try of [`Inner::read_in_one_flight`]: what it came to and what it left.
    async fn try_read(
        &self,
        flights: &mut Flights,
        lease: &Lease,
        request: &SqlRequest,
        sql: &str,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> (Tried, Left) {
        if !flights.prepared
            && let Err(e) = flights.prepare_fixed().await
        {
            tracing::warn!(error = %e, "cannot prepare the server's statements for flights");
            return match left_by(&flights.connection) {
                Left::Lost => (Tried::Done(Err(self.map_wire(&e))), Left::Lost),
                left => (Tried::Driver, left),
            };
        }
        let (statement, cached) = match flights.lookup(sql) {
            Lookup::Ready(statement) => (statement, true),
            Lookup::Driver => return (Tried::Driver, Left::Clean),
            Lookup::Unknown(name) => match self.open_and_prepare(flights, lease, sql, name).await {
                Ok(Some(statement)) => (statement, false),
                Ok(None) => return (Tried::Driver, flights::end_and_reset(flights).await),
                Err(tried) => return tried,
            },
        };
        // From here a statement prepared by this try (`!cached`) runs in the transaction its
        // preparation opened, which a refusal here must end.
        let refuse = |err: ApiError| Tried::Done(Err(err));
        let refused = if statement.params.len() == request.params.len() {
            if let Some((name, ty)) = statement
                .columns
                .iter()
                .find(|(_, ty)| !types::is_supported(ty))
            {
                Some(refuse(types::unsupported(name, ty)))
            } else {
                None
            }
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
        let bound = match bound {
            Ok(bound) => bound,
            Err(tried) if cached => return (tried, Left::Clean),
            Err(tried) => return (tried, flights::end_and_reset(flights).await),
        };
        let params: Vec<Param<'_>> = bound.iter().map(param).collect();
        self.run_read(
            flights, lease, request, sql, &statement, cached, &params, out, sink,
        )
        .await
    }

    /// Opens the read's transaction and prepares the client's statement `sql` as `name` in it,
    /// in one flight: `Ok(None)` when flights do not run it (the transaction is open), `Err`
    /// with what the try came to when PostgreSQL refused it (the transaction ended).
    async fn open_and_prepare(
        &self,
        flights: &mut Flights,
        lease: &Lease,
        sql: &str,
        name: String,
    ) -> Result<Option<Arc<Statement>>, (Tried, Left)> {
        let [timeout, lock_wait] = self.read_timeouts();
        let settings = [text(&timeout), text(&lock_wait)];
        let lost = |e: WireError| (Tried::Done(Err(self.map_wire(&e))), Left::Lost);
        let Some(mut flight) = flights.flight() else {
            return Err((Tried::Done(Err(ApiError::internal())), Left::Lost));
        };
        let encoded = (|| {
            flight
                .bind("", BEGIN_READ.0, &[], Format::Text)?
                .execute("", 0)?
                .bind("", SETTINGS.0, &settings, Format::Text)?
                .execute("", 0)?
                .parse(&name, sql, &[])?
                .describe_statement(&name)?
                .sync();
            Ok::<(), WireError>(())
        })();
        if let Err(e) = encoded {
            // Nothing was sent: the statement's text cannot be (a NUL byte in it).
            return Err((Tried::Done(Err(self.map_wire(&e))), Left::Clean));
        }
        let mut answers = flight.send().await.map_err(lost)?;
        let (mut step, mut positioned) = (0, false);
        let (mut params, mut columns, mut refused) = (None, None, None);
        while let Some(answer) = answers.next().await.map_err(lost)? {
            match answer {
                Answer::Row(row) if step == 1 => positioned = self.learn(lease, &row),
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
            let left = flights::end_and_reset(flights).await;
            if at < 2 && refusal.code == "26000" {
                flights.lost_statements();
                return Err((Tried::Again, left));
            }
            return Err((Tried::Done(Err(self.map_refusal(&refusal))), left));
        }
        let (Some(params), Some(columns), true) = (params, columns, positioned) else {
            tracing::error!("a statement's preparation was answered without all it asks for");
            return Err((Tried::Done(Err(ApiError::internal())), Left::Lost));
        };
        Ok(flights.keep(sql, name, &params, &columns))
    }

    /// Sends the read's flight (its transaction opened unless `opened` by its preparation) and
    /// writes its rows.
    #[expect(
        clippy::too_many_arguments,
        reason = "one read's parts, handed over from its try"
    )]
    async fn run_read(
        &self,
        flights: &mut Flights,
        lease: &Lease,
        request: &SqlRequest,
        sql: &str,
        statement: &Statement,
        cached: bool,
        params: &[Param<'_>],
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> (Tried, Left) {
        let opened = !cached;
        let [timeout, lock_wait] = self.read_timeouts();
        let settings = [text(&timeout), text(&lock_wait)];
        let seed = session::seed();
        let parse_reset = flights.reset_to_parse();
        let lost = |e: &WireError| (Tried::Done(Err(self.map_wire(e))), Left::Lost);
        let Some(mut flight) = flights.flight() else {
            return (Tried::Done(Err(ApiError::internal())), Left::Lost);
        };
        let encoded = (|| {
            if !opened {
                flight
                    .bind("", BEGIN_READ.0, &[], Format::Text)?
                    .execute("", 0)?
                    .bind("", SETTINGS.0, &settings, Format::Text)?
                    .execute("", 0)?;
            }
            flight
                .bind("", &statement.name, params, Format::Binary)?
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
            return (Tried::Done(Err(self.map_wire(&e))), left);
        }
        let steps = if opened {
            Steps {
                settings: None,
                client: 0,
            }
        } else {
            Steps {
                settings: Some(1),
                client: 2,
            }
        };
        let mut answers = match flight.send().await {
            Ok(answers) => answers,
            Err(e) => return lost(&e),
        };
        result::header(
            out,
            statement
                .columns
                .iter()
                .map(|(name, ty)| (name.as_str(), ty.name())),
        );
        let limits = &self.limits;
        let mut writer = RowWriter::new(limits.max_result_bytes);
        let (mut step, mut changed) = (0, 0);
        // The reset answers one row and `SELECT 1`; anything else ran in its place (the unnamed
        // statement was not the reset), and the session is closed rather than trusted.
        let (mut reset_rows, mut reset_done) = (0, false);
        let mut positioned = opened;
        let mut refused: Option<(usize, Box<DbError>)> = None;
        loop {
            let answer = match answers.next().await {
                Ok(Some(answer)) => answer,
                Ok(None) => break,
                Err(WireError::TooLarge {
                    tag: b'D',
                    declared,
                    ..
                }) if step == steps.client => {
                    let row = writer.rows() + 1;
                    // A row of one column is its cell: answered as the driver's path answers a
                    // cell past its bound.
                    let err = match statement.columns.as_slice() {
                        [(name, _)] => value_too_big(
                            name,
                            row,
                            declared.saturating_sub(11),
                            limits.max_value_bytes,
                        ),
                        _ => ApiError::row_too_large(limits.max_result_bytes, row),
                    };
                    return self.give_up(lease, err).await;
                }
                Err(e) => return lost(&e),
            };
            match answer {
                Answer::Row(row) if Some(step) == steps.settings => {
                    positioned = self.learn(lease, &row);
                }
                Answer::Row(row) if step == steps.client => {
                    if row.len() != statement.columns.len() {
                        tracing::error!("a row's cells are not its statement's columns");
                        return self.give_up(lease, ApiError::internal()).await;
                    }
                    let count = writer.rows();
                    if let Some((index, bytes)) = row
                        .iter()
                        .map(|cell| cell.map_or(0, <[u8]>::len))
                        .enumerate()
                        .find(|&(_, bytes)| bytes > limits.max_value_bytes)
                    {
                        let name = &statement.columns[index].0;
                        let err = value_too_big(name, count + 1, bytes, limits.max_value_bytes);
                        return self.give_up(lease, err).await;
                    }
                    writer.begin(out);
                    for (index, (cell, (name, ty))) in
                        row.iter().zip(&statement.columns).enumerate()
                    {
                        writer.cell(out, index);
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
                // A row where `ROLLBACK` stands: a client's function took its name over, and
                // the transaction it leaves open closes the session (`left_by`).
                Answer::Row(_) if step == steps.client + 1 => {}
                // The reset's row (its function returns `void`).
                Answer::Row(_) if step == steps.client + 2 => reset_rows += 1,
                Answer::CommandComplete(done) => {
                    if step == steps.client + 2 {
                        reset_done = done.as_str() == "SELECT 1" && reset_rows == 1;
                    }
                    if step == steps.client && tag::counts_changed_rows(&request.sql) {
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
                tracing::error!(
                    "a read's reset was not answered as the reset; closing the session"
                );
                return (Tried::Done(Ok(changed)), Left::Unreset);
            }
            return (Tried::Done(Ok(changed)), left_by(&flights.connection));
        };
        if at > steps.client {
            // The read is whole (a read keeps nothing, whatever its end did); the session is
            // closed, not pooled.
            tracing::warn!(error = %refusal, "cannot end or reset a read's session; closing it");
            return (Tried::Done(Ok(changed)), Left::Unreset);
        }
        let left = flights::end_and_reset(flights).await;
        // Stale only before the first row, as on the driver's path: a statement that returned
        // rows was planned against the schema it runs on, so its error is the client's own (a
        // function that raised `42501`), not to be answered as a stale statement or run again.
        if at == steps.client && cached && writer.rows() == 0 && is_stale(&refusal.code) {
            flights.forget(sql);
            return (Tried::Again, left);
        }
        if at < steps.client && refusal.code == "26000" {
            // A client's function deallocated the server's statements.
            flights.lost_statements();
            return (Tried::Again, left);
        }
        (Tried::Done(Err(self.map_refusal(&refusal))), left)
    }

    /// Keeps the position the settings' row names (its third cell, a `pg_lsn`'s text) as the
    /// request's; whether it named one.
    fn learn(&self, lease: &Lease, row: &sqlhttp_pgwire::Row) -> bool {
        let position = row
            .iter()
            .nth(2)
            .flatten()
            .and_then(|lsn| std::str::from_utf8(lsn).ok())
            .and_then(crate::protocol::bookmark::from_lsn);
        match position {
            Some(position) => {
                lease
                    .position
                    .fetch_max(position.position(), Ordering::AcqRel);
                true
            }
            None => false,
        }
    }

    /// The answer for a flight whose rows are not read to their end (a cell or row past its
    /// bound, a body nobody reads): its statement is cancelled, and the session lost.
    async fn give_up(&self, lease: &Lease, err: ApiError) -> (Tried, Left) {
        lease.cancel_statement().await;
        (Tried::Done(Err(err)), Left::Lost)
    }

    /// The protocol error for a failure of the flights' connection.
    fn map_wire(&self, err: &WireError) -> ApiError {
        match err {
            WireError::Db(db) | WireError::Fatal(db) => self.map_refusal(db),
            WireError::Invalid(why) => {
                ApiError::sql(format!("the statement cannot be sent: {why}"))
            }
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
                self.closing_or(ApiError::outage(
                    "the connection to the database was lost; retry later",
                ))
            }
        }
    }

    /// The protocol error for PostgreSQL's refusal of a statement in a flight.
    fn map_refusal(&self, db: &DbError) -> ApiError {
        self.closing_or(errors::map_db_error(db, self.timeout_ms()))
    }

    /// Once closing, a cancelled or lost statement is the shutdown's 503 (as [`Inner::map`]).
    fn closing_or(&self, mapped: ApiError) -> ApiError {
        if self.closing.load(Ordering::Acquire)
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

/// The answer when a read's statements went stale again on its second run.
fn stale() -> ApiError {
    ApiError::unavailable(
        "a prepared statement went stale (the schema changed) and the request could not run \
         again; retry",
    )
}

/// An answer a read's flight does not ask for: the session is out of step.
fn unexpected(answer: &Answer) -> (Tried, Left) {
    tracing::error!(?answer, "an unexpected answer in a read's flight");
    (Tried::Done(Err(ApiError::internal())), Left::Lost)
}

/// Whether a cached statement's refusal is one a fresh Parse may not get (see `exec::is_stale`;
/// flights run on the primary only, where no `0A000` is a replica's).
fn is_stale(code: &str) -> bool {
    code == "0A000" || code == "26000" || code.starts_with("42")
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
