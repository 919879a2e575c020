//! A statement sent without `"read_only": true` on the primary, in two flights (ADR 0064): the
//! first opens the server's write transaction and runs the statement, `BEGIN READ WRITE` and its
//! settings (prepared once per connection, reading the transaction's start), the request's
//! guard savepoint, the client's statement with its rows in binary, one `Sync`; the second,
//! once every row was read and answered within its bounds, commits and resets the session: the
//! driver's path's COMMIT message (the guard's release, the check that the transaction is the
//! one opened, `COMMIT`), the read of the log position after it and the reset after a request,
//! as three simple queries, so no statement a client's function prepared can stand in for any
//! part of them. A statement the connection has not prepared yet is prepared inside the transaction,
//! first (`statement_flight`).
//!
//! The COMMIT waits for the second flight because the rows decide it: a cell or a row past its
//! bound, or a requester gone, fails the request, and then nothing of it may be kept. A query
//! that may write nothing (ADR 0069) carries its end in the first flight, behind a savepoint and
//! a check that raises unless its `COMMIT` can keep nothing it wrote: a statement that wrote
//! nothing has nothing for its rows to decide, and its `COMMIT` (which delivers what it
//! notified), the position and the reset run there; one that wrote skips them to the `Sync`,
//! and the second flight rolls back to the savepoint and commits as above. The second flight
//! is not bounded by the give-up watchdog (as the driver's path's `end` is not): a COMMIT
//! under way is left to finish, within the statement timeout and a grace, past which the
//! session is abandoned and the outcome answered unknown.
//!
//! Knows a write's transaction and its end; nothing about HTTP, pooling or replicas.

use sqlhttp_pgwire::{
    Answer, DbError, Error as WireError, Flight, Format, Param, Row, TransactionStatus,
};

use crate::engine::postgres::flights::{self, Flights, Left, Opening, left_by, text};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::statement_flight;
use crate::engine::postgres::statement_flight::{
    self as statement, ClientRows, Ready, Tried, changed, is_stale, once_more, param, settle,
    unexpected,
};
use crate::engine::postgres::transaction;
use crate::engine::postgres::transaction::{POSITION_AFTER_COMMIT, TAMPERED_SQLSTATE, tampered};
use crate::engine::postgres::wire::Lent;
use crate::engine::postgres::{Inner, Job, session};
use crate::engine::sql_text::{self, Dialect};
use crate::engine::stream::Sink;
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

/// What the first flight of a write came to.
enum Ran {
    /// The statement ran and its rows were answered; its transaction is open, to commit.
    /// `checked`: the flight ended past the check that found it wrote ([`WROTE_NOTHING`]), so
    /// the COMMIT's flight first rolls back to [`WRITTEN`], which keeps what it wrote.
    Written { rows: u64, checked: bool },
    /// It ended (refused, failed, given up) and its transaction with it.
    Ended(Tried, Left),
}

/// What a write's COMMIT message and reset came to.
struct Committed {
    /// The answer: `Ok` once the COMMIT is known done.
    answer: Result<(), ApiError>,
    left: Left,
}

/// Runs `request`, a write on the primary, on `lease` in two flights, writing its body into
/// `out` and `sink` as `exec::write_rows` does, and returns the rows it changed with whether
/// the session may serve again. `None` when flights cannot run it here and nothing was sent
/// for it: the caller runs it through the driver. The first flight runs under `job`'s
/// give-up watchdog (`guarded`), the COMMIT after it does not.
pub(super) async fn write_in_flights(
    inner: &Inner,
    job: &Job,
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
    // Each try bounded as a statement, or two when it carries its end (the COMMIT and the
    // reset after it, whose function's work grows with what the session holds).
    let ends_here = may_end_in_one_flight(sql);
    let statements = if ends_here { 2 } else { 1 };
    loop {
        let ran = inner
            .guarded(job, lease, statements, async {
                Ok(try_write(
                    inner,
                    &mut flights,
                    lease,
                    request,
                    sql,
                    ends_here,
                    out,
                    sink,
                )
                .await)
            })
            .await;
        let (tried, left) = match ran {
            Ok(Ran::Written { rows, checked }) => {
                let committed = commit(inner, &mut flights, lease, checked).await;
                (Tried::Done(committed.answer.map(|()| rows)), committed.left)
            }
            Ok(Ran::Ended(tried, left)) => (tried, left),
            // Given up (its requester left, the server closes, the backstop) with its
            // flight's answers unread, or between two flights with its transaction open:
            // the session is lost, and its transaction rolls back with it.
            Err(err) => (Tried::Done(Err(err)), Left::Lost),
        };
        let tried = match once_more(tried, left, &mut again, sink.started(), out) {
            // Its requester left while the try ran: nothing more runs for it, neither a
            // second try nor the driver (no watchdog would see the requester gone).
            None | Some(Tried::Driver) if job.is_cancelled() => {
                Some(Tried::Done(Err(ApiError::interrupted())))
            }
            tried => tried,
        };
        if let Some(tried) = tried {
            return settle(lease, flights, loan, tried, left);
        }
    }
}

/// One try of the first flight of [`write_in_flights`] (carrying its end when
/// `ends_here`: see [`may_end_in_one_flight`]).
#[expect(
    clippy::too_many_arguments,
    reason = "one write's parts, handed over from its request"
)]
async fn try_write(
    inner: &Inner,
    flights: &mut Flights,
    lease: &Lease,
    request: &SqlRequest,
    sql: &str,
    ends_here: bool,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
) -> Ran {
    let opening = Opening::Write {
        guard: &lease.guard,
    };
    let ready = match statement_flight::prepared(inner, flights, lease, request, sql, opening).await
    {
        Ok(ready) => ready,
        Err((tried, left)) => return Ran::Ended(tried, left),
    };
    run_write(
        inner, flights, lease, request, sql, &ready, ends_here, out, sink,
    )
    .await
}

/// Sends the write's first flight (its transaction opened unless its statement was
/// prepared by this try, in the transaction it opened) and writes its rows; on a refusal
/// or a failure, ends the transaction.
#[expect(
    clippy::too_many_arguments,
    reason = "one write's parts, handed over from its try"
)]
async fn run_write(
    inner: &Inner,
    flights: &mut Flights,
    lease: &Lease,
    request: &SqlRequest,
    sql: &str,
    ready: &Ready<'_>,
    ends_here: bool,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
) -> Ran {
    let opening = Opening::Write {
        guard: &lease.guard,
    };
    let opened = !ready.cached;
    let params: Vec<Param<'_>> = ready.bound.iter().map(param).collect();
    let [timeout, lock_wait] = statement_flight::flight_timeouts(inner);
    let settings = [text(&timeout), text(&lock_wait)];
    let lost = |e: &WireError| {
        Ran::Ended(
            Tried::Done(Err(statement_flight::map_wire(inner, e))),
            Left::Lost,
        )
    };
    flights.unnamed_replaced();
    let Some(mut flight) = flights.flight() else {
        return Ran::Ended(Tried::Done(Err(ApiError::internal())), Left::Lost);
    };
    let encoded = (|| {
        if !opened {
            opening.add(&mut flight, &settings)?;
        }
        flight
            .bind("", &ready.statement.name, &params, Format::Binary)?
            .execute("", 0)?;
        if ends_here {
            let timeout_now = format!("SET statement_timeout = {}", inner.timeout_ms());
            add_end_if_unwritten(&mut flight, &timeout_now, &lease.guard)?;
        }
        flight.sync();
        Ok::<(), WireError>(())
    })();
    if let Err(e) = encoded {
        // Nothing was sent (a parameter that cannot be): end what the preparation opened.
        let left = if opened {
            flights::rollback_and_reset(flights).await
        } else {
            Left::Clean
        };
        return Ran::Ended(
            Tried::Done(Err(statement_flight::map_wire(inner, &e))),
            left,
        );
    }
    let (settings_at, client) = if opened {
        (None, 0)
    } else {
        (Some(1), opening.statements())
    };
    let mut answers = match flight.send().await {
        Ok(answers) => answers,
        Err(e) => return lost(&e),
    };
    let limits = &inner.limits;
    let mut rows = ClientRows::start(&ready.statement, limits, out);
    let (mut step, mut changed_rows, mut learnt) = (0, 0, opened);
    // The client's statement was bound: a refusal after it is its execution's, never a stale
    // statement's (those are refused at Bind), and a second run could repeat what its
    // first did outside the transaction.
    let mut bound = false;
    let mut refused: Option<(usize, Box<DbError>)> = None;
    // The end after the statement, when this flight carries it: where its statements are,
    // and what they answered.
    let end = ends_here.then_some(client);
    let at_end = |step: usize, offset: usize| end.is_some_and(|client| step == client + offset);
    let (mut committed, mut reset_rows, mut reset_done) = (false, 0, false);
    let give_up = async |err| {
        let (tried, left) = statement_flight::give_up(lease, err).await;
        Ran::Ended(tried, left)
    };
    loop {
        let answer = match answers.next().await {
            Ok(Some(answer)) => answer,
            Ok(None) => break,
            Err(WireError::TooLarge {
                tag: b'D',
                declared,
                ..
            }) if step == client => {
                let err = rows.too_large(&mut answers, declared, limits).await;
                return give_up(err).await;
            }
            // Lost once its COMMIT was answered as done: every row was answered before it,
            // and the query stands (the session goes with the connection).
            Err(e) if committed => {
                tracing::warn!(error = %e, "the connection failed after a query's COMMIT");
                return Ran::Ended(Tried::Done(Ok(changed_rows)), Left::Lost);
            }
            Err(e) => return lost(&e),
        };
        match answer {
            Answer::Row(row) if Some(step) == settings_at => {
                learnt = statement_flight::learn(lease, opening, &row);
            }
            Answer::Row(row) if step == client => {
                if let Err(err) = rows.write(&row, limits, out, sink).await {
                    return give_up(err).await;
                }
            }
            // The check's row (its function returns `void`): it wrote nothing.
            Answer::Row(_) if at_end(step, End::CHECK) => {}
            Answer::Row(row) if at_end(step, End::POSITION) => keep_position(lease, &row),
            // The reset's row (its function returns `void`).
            Answer::Row(_) if at_end(step, End::RESET_FUNCTION) => reset_rows += 1,
            Answer::CommandComplete(done) => {
                if step == client {
                    changed_rows = changed(request, &done);
                }
                if at_end(step, End::COMMIT) {
                    committed = done.as_str() == "COMMIT";
                }
                if at_end(step, End::RESET_FUNCTION) {
                    reset_done = done.as_str() == "SELECT 1" && reset_rows == 1;
                }
                step += 1;
            }
            Answer::EmptyQuery => step += 1,
            Answer::Error(e) => refused = Some((step, e)),
            Answer::BindComplete if step == client => bound = true,
            Answer::ParseComplete
            | Answer::BindComplete
            | Answer::CloseComplete
            | Answer::ReadyForQuery(_) => {}
            other => {
                let (tried, left) = unexpected(&other);
                return Ran::Ended(tried, left);
            }
        }
    }
    flights.closed();
    let Some((at, refusal)) = refused else {
        if ends_here {
            // Committed and reset in this flight: the statement wrote nothing.
            return if !committed {
                // `COMMIT` not answered as done (no way is known without a refusal):
                // nothing is taken as kept.
                let left = flights::rollback_and_reset(flights).await;
                Ran::Ended(Tried::Done(Err(tampered())), left)
            } else if reset_done {
                Ran::Ended(Tried::Done(Ok(changed_rows)), left_by(&flights.connection))
            } else {
                tracing::error!("a write's reset was not answered as the reset; closing it");
                Ran::Ended(Tried::Done(Ok(changed_rows)), Left::Unreset)
            };
        }
        if !learnt {
            tracing::error!("a write's BEGIN did not name its transaction");
            return Ran::Ended(Tried::Done(Err(ApiError::internal())), Left::Lost);
        }
        if flights.connection.transaction_status() != TransactionStatus::InTransaction {
            // The client's statement ended the server's transaction: nothing is committed
            // in its place (ADR 0027).
            let left = flights::rollback_and_reset(flights).await;
            return Ran::Ended(Tried::Done(Err(tampered())), left);
        }
        return Ran::Written {
            rows: changed_rows,
            checked: false,
        };
    };
    if let Some(client) = end
        && at > client
    {
        return refused_at_end(
            inner,
            flights,
            at - client,
            &refusal,
            changed_rows,
            committed,
        )
        .await;
    }
    let left = flights::rollback_and_reset(flights).await;
    // Stale only when refused at Bind.
    if at == client && ready.cached && !bound && is_stale(&refusal.code) {
        flights.forget(sql);
        return Ran::Ended(Tried::Again, left);
    }
    if at < client && refusal.code == "26000" {
        // A client's function deallocated the server's statements.
        flights.lost_statements();
        return Ran::Ended(Tried::Again, left);
    }
    Ran::Ended(
        Tried::Done(Err(statement_flight::map_refusal(inner, &refusal))),
        left,
    )
}

/// What a first flight that carried the end after its statement came to when PostgreSQL
/// refused the end's statement at `offset` (see [`End`]), the statement having changed
/// `rows`, and `committed` when its `COMMIT` was answered as done. Everything after the
/// refusal was skipped to the `Sync`.
async fn refused_at_end(
    inner: &Inner,
    flights: &mut Flights,
    offset: usize,
    refusal: &DbError,
    rows: u64,
    committed: bool,
) -> Ran {
    match offset {
        // The check raised: the statement wrote (or the check could not tell). The
        // transaction stands in error at the savepoint after the statement; the COMMIT's
        // flight rolls back to it and commits what the statement did.
        End::CHECK => {
            if refusal.code == "42883" {
                // The server's function is gone (dropped under a running server): every
                // unflagged query pays two flights until a restart creates it again.
                tracing::warn!(error = %refusal, "the one-flight check is missing");
            } else if refusal.code != WROTE_SQLSTATE {
                tracing::debug!(error = %refusal, "the one-flight check could not tell");
            }
            Ran::Written {
                rows,
                checked: true,
            }
        }
        // Refused before or at `COMMIT` (the guard gone, a COMMIT refused): nothing is
        // kept, and the session is ended and reset.
        End::TIMEOUT..=End::COMMIT => {
            let left = flights::rollback_and_reset(flights).await;
            // The guard gone (`3B001`): something ended what the server opened.
            let answer = if offset == End::RELEASE && refusal.code == "3B001" {
                tampered()
            } else {
                statement_flight::map_refusal(inner, refusal)
            };
            Ran::Ended(Tried::Done(Err(answer)), left)
        }
        // Past a `COMMIT` that was not answered as done (no way is known: a `COMMIT` that
        // did not commit is refused, or answers `ROLLBACK` after a refusal): nothing is
        // taken as kept, and the session is ended and reset.
        _ if !committed => {
            tracing::error!(error = %refusal, "a query's end went on past a COMMIT not done");
            let left = flights::rollback_and_reset(flights).await;
            Ran::Ended(Tried::Done(Err(tampered())), left)
        }
        // Committed; the position after it or the reset failed: the write stands (without
        // its bookmark when the position is what failed), and the session is not pooled.
        _ => {
            tracing::warn!(error = %refusal, "cannot reset a session after its COMMIT; closing it");
            Ran::Ended(Tried::Done(Ok(rows)), Left::Unreset)
        }
    }
}

/// Commits the write whose first flight left its transaction open, and resets the session,
/// in one flight of three simple queries (the driver's path's COMMIT message, the position
/// after it and `session::RESET`), within the statement timeout and a grace; `checked`:
/// rolled back to [`WRITTEN`] first, in a query of its own (see [`Ran::Written`]).
async fn commit(inner: &Inner, flights: &mut Flights, lease: &Lease, checked: bool) -> Committed {
    let opened = lease
        .opened
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let Some(opened) = opened else {
        let left = flights::rollback_and_reset(flights).await;
        return Committed {
            answer: Err(tampered()),
            left,
        };
    };
    let message = transaction::commit_message(inner, &lease.guard, &opened);
    let sent = tokio::time::timeout(
        transaction::end_within(inner, true),
        commit_flight(flights, lease, &message, checked),
    )
    .await;
    let unknown = |why: &str| {
        ApiError::outcome_unknown(format!(
            "{why}; whether the transaction was kept is unknown: retry with the same \
             Idempotency-Key, or check"
        ))
    };
    // Abandoned with its answers unread: the session is lost, and its COMMIT may have
    // completed meanwhile.
    let Ok(ended) = sent else {
        return Committed {
            answer: Err(unknown(&format!(
                "the transaction did not finish ending within this server's limit of \
                     {} ms (--statement-timeout)",
                inner.timeout_ms()
            ))),
            left: Left::Lost,
        };
    };
    match ended {
        CommitFlight::Lost { committed: true } => Committed {
            answer: Ok(()),
            left: Left::Lost,
        },
        CommitFlight::Lost { committed: false } => Committed {
            answer: Err(unknown(
                "the connection to the database was lost while the transaction committed",
            )),
            left: Left::Lost,
        },
        CommitFlight::Committed { reset } => Committed {
            answer: Ok(()),
            left: if reset && flights::left_by(&flights.connection) == Left::Clean {
                Left::Clean
            } else {
                tracing::warn!("cannot reset a session after its COMMIT; closing it");
                Left::Unreset
            },
        },
        CommitFlight::Refused { refusal, reset } => {
            // Not committed: whatever transaction the session is in is not to be kept.
            let left = if reset && flights::left_by(&flights.connection) == Left::Clean {
                Left::Clean
            } else {
                flights::rollback_and_reset(flights).await
            };
            let answer = match refusal {
                Some(refusal) if refusal.code != TAMPERED_SQLSTATE => {
                    statement_flight::map_refusal(inner, &refusal)
                }
                // The check's refusal, or no COMMIT and nothing said why.
                _ => tampered(),
            };
            Committed {
                answer: Err(answer),
                left,
            }
        }
    }
}

/// Sends the COMMIT's `message`, the read of the position and the reset, and reads their
/// answers, keeping the log position read after the commit.
async fn commit_flight(
    flights: &mut Flights,
    lease: &Lease,
    message: &str,
    checked: bool,
) -> CommitFlight {
    flights.unnamed_replaced();
    let flights_closing = flights.closing();
    let Some(mut flight) = flights.flight() else {
        return CommitFlight::Lost { committed: false };
    };
    // The answers of Closes still pending end with a `ReadyForQuery` of their own, first;
    // then the rollback to the savepoint after the statement's, when there is one.
    let closes = usize::from(flights_closing) + usize::from(checked);
    if checked && flight.query(ROLLBACK_TO_WRITTEN).is_err() {
        return CommitFlight::Refused {
            refusal: None,
            reset: true,
        };
    }
    if flight
        .query(message)
        .and_then(|flight| flight.query(POSITION_AFTER_COMMIT))
        .and_then(|flight| flight.query(session::RESET))
        .is_err()
    {
        // Nothing was sent: the texts are the server's own, and always encode.
        return CommitFlight::Refused {
            refusal: None,
            reset: true,
        };
    }
    let Ok(mut answers) = flight.send().await else {
        return CommitFlight::Lost { committed: false };
    };
    // The message's statements, counted by their ends: `COMMIT` is its fifth and last.
    const COMMIT_STEP: usize = 4;
    // The queries by their `ReadyForQuery`s: the message, the position, the reset.
    const MESSAGE: usize = 0;
    const POSITION: usize = 1;
    let (mut ready, mut step, mut committed) = (0_usize, 0, false);
    let (mut refused, mut reset) = (None, true);
    loop {
        let answer = match answers.next().await {
            Ok(Some(answer)) => answer,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "the connection failed while a write committed");
                return CommitFlight::Lost { committed };
            }
        };
        let is_ready = matches!(answer, Answer::ReadyForQuery(_));
        // Before the message's own: the pending Closes' answers, then the rollback to the
        // savepoint's, whose refusal (the message then refused as in an aborted
        // transaction) is the one answered.
        let Some(query) = ready.checked_sub(closes) else {
            if let Answer::Error(e) = answer
                && ready >= usize::from(flights_closing)
            {
                refused = Some(e);
            }
            ready += usize::from(is_ready);
            continue;
        };
        match answer {
            Answer::CommandComplete(done) if query == MESSAGE => {
                if step == COMMIT_STEP {
                    committed = done.as_str() == "COMMIT";
                }
                step += 1;
            }
            Answer::Row(row) if query == POSITION => keep_position(lease, &row),
            Answer::Error(e) if query == MESSAGE => {
                refused.get_or_insert(e);
            }
            // The position's read failed: a kept write goes without its bookmark.
            Answer::Error(_) if query == POSITION => {
                tracing::warn!("a write's position after its COMMIT was not read");
            }
            Answer::Error(_) => reset = false,
            _ => {}
        }
        ready += usize::from(is_ready);
    }
    flights.closed();
    if committed {
        return CommitFlight::Committed { reset };
    }
    CommitFlight::Refused {
        refusal: refused,
        reset,
    }
}

/// How a write's COMMIT flight went.
enum CommitFlight {
    /// Its COMMIT was answered as done; `reset`: the session's reset after it too.
    Committed { reset: bool },
    /// Not committed: PostgreSQL refused `refusal`, a statement of the message (`None`: no
    /// `COMMIT` ran and nothing said why); `reset`: the session's reset after it ran.
    Refused {
        refusal: Option<Box<DbError>>,
        reset: bool,
    },
    /// The connection failed with answers unread; `committed` when the COMMIT was answered
    /// as done before it did.
    Lost { committed: bool },
}

/// The name of the savepoint a write's first flight takes after the client's statement when
/// it carries the end ([`add_end_if_unwritten`]): what the statement did stands before it.
macro_rules! written {
    () => {
        "_sqlhttp_written"
    };
}

/// The savepoint after the client's statement ([`written!`]).
const WRITTEN: &str = concat!("SAVEPOINT ", written!());

/// The COMMIT's flight's first query after a first flight whose check found a write.
const ROLLBACK_TO_WRITTEN: &str = concat!("ROLLBACK TO SAVEPOINT ", written!());

/// Raises unless the `COMMIT` after it can keep nothing a statement wrote (ADR 0069,
/// `setup`'s `_sqlhttp.check_wrote_nothing()`): when the transaction was given an id (a
/// statement in it wrote, locked a row, made a temporary table), when a held cursor is open
/// (its query runs at `COMMIT`, and may write), or when a foreign table exists (`postgres_fdw`
/// commits its remote writes at `COMMIT`, and they take no local id; one made in this
/// transaction took one). A `NOTIFY` takes its id only at `COMMIT`, after this, and is
/// delivered by it. Qualified: a client's function may have set the search path; and a
/// function missing or refused reads as a write, which the second flight commits.
const WROTE_NOTHING: &str = "SELECT _sqlhttp.check_wrote_nothing()";

/// The check's own refusal ([`WROTE_NOTHING`]).
const WROTE_SQLSTATE: &str = "SQLHW";

/// Where the end's statements answer, counted from the client's statement (ADR 0069).
struct End;

impl End {
    const TIMEOUT: usize = 1;
    const CHECK: usize = 3;
    const RELEASE: usize = 4;
    const COMMIT: usize = 5;
    const POSITION: usize = 6;
    /// The last: `_sqlhttp.reset_request()`.
    const RESET_FUNCTION: usize = 6 + session::RESET_STATEMENTS.len();
}

/// Adds the end of a write that may have written nothing to its first flight, behind the
/// client's statement (ADR 0069): the server's statement timeout for the session
/// (`timeout_now`, as the COMMIT's message sets it, first: a client's function may have set
/// one of a millisecond), [`WRITTEN`], the check [`WROTE_NOTHING`], the release of `guard`,
/// `COMMIT`, the position after it and the reset after a request. Each is parsed here as the
/// unnamed statement, which no client's function can take over. When the statement wrote, the
/// check's refusal skips the rest to the `Sync`, and the transaction waits for the COMMIT's
/// own flight as every write's does.
fn add_end_if_unwritten(
    flight: &mut Flight<'_, Lent>,
    timeout_now: &str,
    guard: &str,
) -> Result<(), WireError> {
    flight
        .statement(timeout_now)?
        .statement(WRITTEN)?
        .statement(WROTE_NOTHING)?
        .statement(&format!("RELEASE SAVEPOINT {guard}"))?
        .statement("COMMIT")?
        .statement(POSITION_AFTER_COMMIT)?;
    for reset in session::RESET_STATEMENTS {
        flight.statement(reset)?;
    }
    Ok(())
}

/// Whether a statement sent without `"read_only": true` is likely to write nothing, so its
/// first flight carries the end too (ADR 0069): a query (`SELECT`, `VALUES`, `TABLE`, `WITH`)
/// that does not name `NOTIFY` or `pg_notify`. Only the cost depends on this guess: a
/// statement that wrote is found by the check, and committed by a second flight.
fn may_end_in_one_flight(sql: &str) -> bool {
    let query = sql_text::statement(sql, Dialect::Postgres)
        .is_some_and(|s| matches!(s.first.as_str(), "SELECT" | "VALUES" | "TABLE" | "WITH"));
    query
        && !sql
            .as_bytes()
            .windows(b"notify".len())
            .any(|w| w.eq_ignore_ascii_case(b"notify"))
}

/// Keeps the log position a `row` read after a COMMIT names, for the write's bookmark.
fn keep_position(lease: &Lease, row: &Row) {
    if let Some(position) = row
        .iter()
        .next()
        .flatten()
        .and_then(|cell| std::str::from_utf8(cell).ok())
        .and_then(crate::protocol::bookmark::from_lsn)
    {
        lease
            .position
            .fetch_max(position.position(), std::sync::atomic::Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_that_may_write_nothing_carry_their_end_and_the_rest_do_not() {
        for sql in [
            "SELECT 1",
            "  select k FROM t WHERE k = $1",
            "-- a comment\nVALUES (1)",
            "TABLE t",
            "WITH a AS (SELECT 1) SELECT * FROM a",
            // A guess: the check finds what it wrote.
            "WITH a AS (INSERT INTO t VALUES (1) RETURNING k) SELECT * FROM a",
        ] {
            assert!(may_end_in_one_flight(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET k = 2",
            "DELETE FROM t",
            "CREATE TABLE u (k int)",
            "SELECT pg_notify('c', 'x')",
            "SELECT pg_catalog.PG_NOTIFY('c', 'x')",
            "(SELECT 1)",
            "",
        ] {
            assert!(!may_end_in_one_flight(sql), "{sql}");
        }
    }
}
