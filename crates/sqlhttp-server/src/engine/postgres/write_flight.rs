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
//! bound, or a requester gone, fails the request, and then nothing of it may be kept. The second
//! flight is not bounded by the give-up watchdog (as the driver's path's `end` is not): a COMMIT
//! under way is left to finish, within the statement timeout and a grace, past which the
//! session is abandoned and the outcome answered unknown.
//!
//! Knows a write's transaction and its end; nothing about HTTP, pooling or replicas.

use sqlhttp_pgwire::{Answer, DbError, Error as WireError, Format, Param, TransactionStatus};

use crate::engine::postgres::flights::{self, Flights, Left, Opening, text};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::statement_flight::{
    self as statement, ClientRows, Ready, Tried, changed, is_stale, once_more, param, settle,
    unexpected,
};
use crate::engine::postgres::transaction::{POSITION_AFTER_COMMIT, TAMPERED_SQLSTATE, tampered};
use crate::engine::postgres::{Inner, Job, session};
use crate::engine::stream::Sink;
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

/// What the first flight of a write came to.
enum Ran {
    /// The statement ran and its rows were answered; its transaction is open, to commit.
    Written(u64),
    /// It ended (refused, failed, given up) and its transaction with it.
    Ended(Tried, Left),
}

/// What a write's COMMIT message and reset came to.
struct Committed {
    /// The answer: `Ok` once the COMMIT is known done.
    answer: Result<(), ApiError>,
    left: Left,
}

impl Inner {
    /// Runs `request`, a write on the primary, on `lease` in two flights, writing its body into
    /// `out` and `sink` as `exec::write_rows` does, and returns the rows it changed with whether
    /// the session may serve again. `None` when flights cannot run it here and nothing was sent
    /// for it: the caller runs it through the driver. The first flight runs under `job`'s
    /// give-up watchdog (`guarded`), the COMMIT after it does not.
    pub(super) async fn write_in_flights(
        &self,
        job: &Job,
        lease: &Lease,
        request: &SqlRequest,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> Option<(Result<u64, ApiError>, bool)> {
        let mut flights = lease.take_flights()?;
        let sql = match statement::checked_sql(request) {
            Ok(sql) => sql,
            Err(err) => {
                lease.keep_flights(flights);
                return Some((Err(err), true));
            }
        };
        let Some(loan) = statement::lend(&flights).await else {
            lease.keep_flights(flights);
            return None;
        };
        let mut again = true;
        loop {
            // Each try bounded as a statement.
            let ran = self
                .guarded(job, lease, 1, async {
                    Ok(self
                        .try_write(&mut flights, lease, request, &sql, out, sink)
                        .await)
                })
                .await;
            let (tried, left) = match ran {
                Ok(Ran::Written(rows)) => {
                    let committed = self.commit(&mut flights, lease).await;
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

    /// One try of the first flight of [`Inner::write_in_flights`].
    async fn try_write(
        &self,
        flights: &mut Flights,
        lease: &Lease,
        request: &SqlRequest,
        sql: &str,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> Ran {
        let opening = Opening::Write {
            guard: &lease.guard,
        };
        let ready = match self.prepared(flights, lease, request, sql, opening).await {
            Ok(ready) => ready,
            Err((tried, left)) => return Ran::Ended(tried, left),
        };
        self.run_write(flights, lease, request, sql, &ready, out, sink)
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
        &self,
        flights: &mut Flights,
        lease: &Lease,
        request: &SqlRequest,
        sql: &str,
        ready: &Ready<'_>,
        out: &mut Vec<u8>,
        sink: &mut Sink<'_>,
    ) -> Ran {
        let opening = Opening::Write {
            guard: &lease.guard,
        };
        let opened = !ready.cached;
        let params: Vec<Param<'_>> = ready.bound.iter().map(param).collect();
        let [timeout, lock_wait] = self.flight_timeouts();
        let settings = [text(&timeout), text(&lock_wait)];
        let lost = |e: &WireError| Ran::Ended(Tried::Done(Err(self.map_wire(e))), Left::Lost);
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
                .execute("", 0)?
                .sync();
            Ok::<(), WireError>(())
        })();
        if let Err(e) = encoded {
            // Nothing was sent (a parameter that cannot be): end what the preparation opened.
            let left = if opened {
                flights::rollback_and_reset(flights).await
            } else {
                Left::Clean
            };
            return Ran::Ended(Tried::Done(Err(self.map_wire(&e))), left);
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
        let limits = &self.limits;
        let mut rows = ClientRows::start(&ready.statement, limits, out);
        let (mut step, mut changed_rows, mut learnt) = (0, 0, opened);
        // The client's statement was bound: a refusal after it is its execution's, never a stale
        // statement's (those are refused at Bind), and a second run could repeat what its
        // first did outside the transaction.
        let mut bound = false;
        let mut refused: Option<(usize, Box<DbError>)> = None;
        let give_up = async |err| {
            let (tried, left) = self.give_up(lease, err).await;
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
                Err(e) => return lost(&e),
            };
            match answer {
                Answer::Row(row) if Some(step) == settings_at => {
                    learnt = self.learn(lease, opening, &row);
                }
                Answer::Row(row) if step == client => {
                    if let Err(err) = rows.write(&row, limits, out, sink).await {
                        return give_up(err).await;
                    }
                }
                Answer::CommandComplete(done) => {
                    if step == client {
                        changed_rows = changed(request, &done);
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
            return Ran::Written(changed_rows);
        };
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
        Ran::Ended(Tried::Done(Err(self.map_refusal(&refusal))), left)
    }

    /// Commits the write whose first flight left its transaction open, and resets the session,
    /// in one flight of three simple queries (the driver's path's COMMIT message, the position
    /// after it and `session::RESET`), within the statement timeout and a grace.
    async fn commit(&self, flights: &mut Flights, lease: &Lease) -> Committed {
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
        let message = self.commit_message(&lease.guard, &opened);
        let sent = tokio::time::timeout(
            self.end_within(true),
            self.commit_flight(flights, lease, &message),
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
                    self.timeout_ms()
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
                        self.map_refusal(&refusal)
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
        &self,
        flights: &mut Flights,
        lease: &Lease,
        message: &str,
    ) -> CommitFlight {
        flights.unnamed_replaced();
        let flights_closing = flights.closing();
        let Some(mut flight) = flights.flight() else {
            return CommitFlight::Lost { committed: false };
        };
        // The answers of Closes still pending end with a `ReadyForQuery` of their own, first.
        let closes = usize::from(flights_closing);
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
            // Before the message's own: the pending Closes' answers.
            let Some(query) = ready.checked_sub(closes) else {
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
                Answer::Row(row) if query == POSITION => {
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
                Answer::Error(e) if query == MESSAGE => refused = Some(e),
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
