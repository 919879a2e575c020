//! [`Lease`]: one pooled PostgreSQL connection held by one request, and what happens to it
//! when the request lets go (pooled when clean, its statement cancelled and its session ended
//! when not), with [`Inner::lease`] that hands one out within the admission bound and
//! [`Inner::again`] for a request that runs a second time on it, and [`Backends`], each pooled
//! connection's backend process, learned once when it logged in.
//!
//! Knows deadpool's objects, tokio-postgres's cancel tokens and `wire`'s cuts; nothing about
//! what runs on the connection or about HTTP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use deadpool_postgres::{ClientWrapper, Object, StatementCache};
use tokio::sync::OwnedSemaphorePermit;
use tokio_postgres::{CancelToken, Client};

use crate::engine::postgres::aging::DriverAges;
use crate::engine::postgres::ahead::PrimaryLog;
use crate::engine::postgres::flights::Flights;
use crate::engine::postgres::transaction::Opened;
use crate::engine::postgres::{CONNECT_WITHIN, Inner, Job, STOP_WITHIN, session, wire};
use crate::engine::shutting_down;
use crate::protocol::bookmark::ServedBy;
use crate::protocol::error::ApiError;
use crate::timing::Timing;

/// The savepoint every request's transaction opens first and releases last is named this and
/// a random suffix drawn for each request, so a client cannot re-create it (ADR 0027).
const GUARD_PREFIX: &str = "_sqlhttp_guard_";

/// A guard savepoint's name: [`GUARD_PREFIX`] and `id` in sixteen hexadecimal digits, written
/// without the formatting machinery (a lease is taken per request).
fn guard_name(id: u64) -> String {
    let mut name = String::with_capacity(GUARD_PREFIX.len() + 16);
    name.push_str(GUARD_PREFIX);
    name.extend(crate::hex::digits::<16>(u128::from(id)).map(char::from));
    name
}

/// A pooled connection held by one request. Dropped before its release (the requester
/// went away mid-transaction), its statement is cancelled and the connection is discarded, so
/// PostgreSQL rolls the transaction back.
pub(super) struct Lease {
    pub(super) object: Option<Object>,
    pub(super) id: u64,
    pub(super) cancel: CancelToken,
    pub(super) in_flight: Arc<Mutex<HashMap<u64, CancelToken>>>,
    pub(super) clean: bool,
    /// A cancel request was sent to the session. PostgreSQL may deliver it after the statement
    /// it was meant for has ended, to the next one the session runs, so the connection never
    /// serves another request (it is closed, not returned to the pool).
    pub(super) cancel_sent: AtomicBool,
    /// The session's backend process (see [`Backends`]; 0 when it is not known).
    pub(super) backend: AtomicI32,
    /// Whose connection it is, as a body's `stats` says.
    pub(super) served_by: ServedBy,
    /// This request's guard savepoint (see [`GUARD_PREFIX`]).
    pub(super) guard: String,
    /// The transaction the server opened, once it did.
    pub(super) opened: Mutex<Option<Opened>>,
    /// Prepare every statement afresh, past the connection's cache (see `exec::prepare`): the
    /// second run of a request whose cached statement went stale.
    pub(super) fresh: AtomicBool,
    /// A cached statement failed as a stale one does (see `exec::prepare`): the request runs
    /// once more, in a new transaction, with every statement prepared afresh.
    pub(super) stale: AtomicBool,
    /// The session lost statements the driver prepared (a client's function ran `DEALLOCATE`
    /// through dynamic SQL): the driver cannot look types up on it any more, so it is closed
    /// and the request runs once more on another connection (see [`Lease::lose_statements`]).
    pub(super) lost_statements: AtomicBool,
    /// How to log in beside the pool, to end a session the server gave up on (and where to
    /// send a cancel request).
    pub(super) reaper: Arc<wire::Target>,
    /// What the connections were cut for (see `wire`).
    pub(super) cuts: Arc<wire::Cuts>,
    /// How far the request has seen the log (its job's: see `Job::position`).
    pub(super) position: Arc<AtomicU64>,
    /// The least position the request's read must see (its bookmark; 0 for none).
    pub(super) min: u64,
    /// On the primary: where [`Lease::position`] goes when the lease ends, so a bookmark this
    /// process answered is never past what it has seen (see `ahead`).
    pub(super) log: Option<Arc<PrimaryLog>>,
    /// Where the connection keeps its flights between requests (see `flights`); `None` for a
    /// connection that has none.
    pub(super) flights: Option<FlightsHome>,
    /// When each text in the connection's driver cache was last looked up (see `aging`); `None`
    /// for a connection never learned.
    pub(super) driver_ages: Option<Arc<Mutex<DriverAges>>>,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// Where a pooled connection keeps its [`Flights`] while no request holds them.
pub(super) type FlightsHome = Arc<Mutex<Option<Flights>>>;

impl Lease {
    /// Cancels the statement the session runs now; the session is not reused after.
    pub(super) async fn cancel_statement(&self) {
        self.cancel_sent.store(true, Ordering::Release);
        wire::cancel(&self.cancel, &self.reaper).await;
    }

    /// What the session's connection was cut for, if `wire` cut it (asked once).
    pub(super) fn cut(&self) -> Option<wire::Cut> {
        match self.backend.load(Ordering::Acquire) {
            0 => None,
            pid => self.cuts.take(pid),
        }
    }

    /// Closes the session when the lease ends instead of pooling it: its driver's read buffer
    /// grew to hold a large row, and would keep that size for the connection's life.
    pub(super) fn retire(&self) {
        self.cancel_sent.store(true, Ordering::Release);
    }

    pub(super) fn client(&self) -> &Client {
        // The object is taken only in drop.
        self.object
            .as_ref()
            .map(|object| &***object)
            .expect("a live lease")
    }

    /// The connection's prepared statements, by text (see `exec::prepare`).
    pub(super) fn cache(&self) -> &deadpool_postgres::StatementCache {
        &self.wrapper().statement_cache
    }

    /// Empties the connection's driver cache (its statements are closed on the session), and
    /// forgets their ages.
    pub(super) fn forget_driver_statements(&self) {
        self.cache().clear();
        if let Some(ages) = &self.driver_ages {
            ages.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .forget_all();
        }
    }

    /// Records a lookup of `sql` in the connection's driver cache (see `aging`).
    pub(super) fn looked_up_in_driver_cache(&self, sql: &str) {
        if let Some(ages) = &self.driver_ages {
            ages.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .looked_up(sql);
        }
    }

    /// The connection with its cache of prepared statements.
    pub(super) fn wrapper(&self) -> &deadpool_postgres::ClientWrapper {
        // The object is taken only in drop.
        self.object.as_deref().expect("a live lease")
    }

    /// The session lost the driver's prepared statements (`26000` from one of them): it is
    /// closed after this request, and the request runs once more on another connection, when it
    /// has not run twice already (see [`Inner::again`]).
    pub(super) fn lose_statements(&self) {
        tracing::warn!(
            "a session lost the driver's prepared statements (a function deallocated them); \
             closing it"
        );
        self.lost_statements.store(true, Ordering::Release);
        self.stale.store(true, Ordering::Release);
        self.retire();
    }

    /// The connection's flights, for this request (see `flights`).
    pub(super) fn take_flights(&self) -> Option<Flights> {
        self.flights
            .as_ref()?
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Gives the connection's flights back, every answer of theirs read.
    pub(super) fn keep_flights(&self, flights: Flights) {
        if let Some(home) = &self.flights {
            *home.lock().unwrap_or_else(PoisonError::into_inner) = Some(flights);
        }
    }

    /// Whether a request that failed on this lease is to run once more: a cached statement
    /// went stale (DDL changed what it reads) on its first run, before anything was sent. The
    /// transaction it ran in has rolled back, so nothing of that run was kept; the second run
    /// prepares every statement afresh, as the server did before it cached any.
    pub(super) fn take_retry(&self) -> bool {
        self.stale.swap(false, Ordering::AcqRel) && !self.fresh.swap(true, Ordering::AcqRel)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(log) = &self.log {
            log.saw(self.position.load(Ordering::Acquire));
        }
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
        if self.clean {
            if self.cancel_sent.load(Ordering::Acquire)
                && let Some(object) = self.object.take()
            {
                // Closing the connection ends its (idle) session; a late cancel then lands
                // nowhere.
                drop(Object::take(object));
            }
            return;
        }
        if let Some(object) = self.object.take() {
            let client = Object::take(object);
            let cancel = self.cancel.clone();
            let backend = self.backend.load(Ordering::Acquire);
            let reaper = Arc::clone(&self.reaper);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    wire::cancel(&cancel, &reaper).await;
                    drop(client);
                    // A function can catch the cancel and go on (holding its locks and a
                    // connection slot); its backend cannot catch being terminated.
                    if backend != 0 {
                        terminate(&reaper, backend).await;
                    }
                });
            }
        }
    }
}

/// Ends the session of backend `pid` from a connection of its own (the client role may end its
/// own sessions), and waits (briefly) until it is gone.
async fn terminate(target: &wire::Target, pid: i32) {
    let ended = async {
        let (client, driver) = wire::connect(target).await?;
        client
            .query_one("SELECT pg_catalog.pg_terminate_backend($1)", &[&pid])
            .await?;
        drop(client);
        let _ = driver.await;
        Ok::<(), tokio_postgres::Error>(())
    };
    match tokio::time::timeout(CONNECT_WITHIN, ended).await {
        Ok(Ok(())) => tracing::debug!(pid, "ended a session the server gave up on"),
        Ok(Err(e)) => tracing::warn!(pid, error = %e, "cannot end a session the server gave up on"),
        Err(_) => tracing::warn!(pid, "cannot end a session the server gave up on: no answer"),
    }
}

/// Each pooled connection's backend process id, asked once when it logged in (it is the
/// session's for its whole life), so a request needs no statement of its own to learn which
/// session it holds: `wire` names what it cut by that id, and a session the server gives up on
/// is terminated by it. A connection is known by its statement cache, which lives exactly as
/// long as it does; entries of connections gone are dropped whenever another is learned, so
/// this holds about as many entries as the pool has connections.
#[derive(Debug, Default)]
pub(super) struct Backends(Mutex<Vec<Backend>>);

/// One pooled connection's backend process, where it keeps its flights, and its driver cache's
/// ages.
#[derive(Debug)]
struct Backend {
    cache: Weak<StatementCache>,
    pid: i32,
    flights: Option<FlightsHome>,
    driver_ages: Arc<Mutex<DriverAges>>,
}

/// What [`Backends`] knows of one connection.
pub(super) struct Known {
    /// Its backend process id (0 when it was never learned).
    pub(super) pid: i32,
    pub(super) flights: Option<FlightsHome>,
    pub(super) driver_ages: Option<Arc<Mutex<DriverAges>>>,
}

impl Backends {
    /// Asks a connection that just logged in for its backend process id, and keeps it with the
    /// connection's flights over its wire (`cuts` knows each connection's: see `wire`), bounded
    /// by `limits`; `None` for a pool whose connections run no flights (a replica's).
    pub(super) async fn learn(
        &self,
        connection: &ClientWrapper,
        cuts: &wire::Cuts,
        limits: Option<&crate::config::Limits>,
    ) -> Result<(), String> {
        let row = connection
            .query_one("SELECT pg_catalog.pg_backend_pid()", &[])
            .await
            .map_err(|e| format!("cannot ask a new connection for its backend: {e}"))?;
        let pid: i32 = row.get(0);
        let wire = cuts.take_wire(pid);
        let flights = wire
            .zip(limits)
            .map(|(wire, limits)| Arc::new(Mutex::new(Some(Flights::new(&wire, limits)))));
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        known.retain(|backend| backend.cache.strong_count() > 0);
        known.push(Backend {
            cache: Arc::downgrade(&connection.statement_cache),
            pid,
            flights,
            driver_ages: Arc::default(),
        });
        Ok(())
    }

    /// What is known of `connection`.
    pub(super) fn of(&self, connection: &ClientWrapper) -> Known {
        // A live entry's allocation cannot be reused while its Weak is held: the pointers name
        // one connection each.
        let cache = Arc::as_ptr(&connection.statement_cache);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|backend| std::ptr::eq(backend.cache.as_ptr(), cache))
            .map_or(
                Known {
                    pid: 0,
                    flights: None,
                    driver_ages: None,
                },
                |backend| Known {
                    pid: backend.pid,
                    flights: backend.flights.clone(),
                    driver_ages: Some(Arc::clone(&backend.driver_ages)),
                },
            )
    }
}

impl Inner {
    /// A connection for one request, or 503 when the server is closing, the queue is full or
    /// the database cannot be reached.
    pub(super) async fn lease(&self, job: &Job) -> Result<Lease, ApiError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        if job.is_cancelled() {
            // Nobody waits for the answer any more.
            return Err(ApiError::interrupted());
        }
        let permit = Arc::clone(&self.admission)
            .try_acquire_owned()
            .map_err(|_| {
                self.failed_here(ApiError::unavailable(
                    "the database is busy: too many statements are waiting; retry later",
                ))
            })?;
        // A client's function may have changed the client role (its defaults, its password):
        // once the owner has put it back, one more login is clean (see `session`).
        let object = Timing::queue("postgresql", async {
            match self.pool.get().await {
                Err(e) if session::worth_retrying(&self.keeper, &e).await => self.pool.get().await,
                got => got,
            }
        })
        .await;
        let object = object.map_err(|e| {
            use deadpool_postgres::PoolError as E;
            match e {
                E::Timeout(_) => self.failed_here(ApiError::unavailable(
                    "the database is busy: no connection came free in time; retry later",
                )),
                E::Closed => shutting_down(),
                other => {
                    tracing::warn!(error = %other, "cannot get a database connection");
                    self.failed_here(ApiError::outage(
                        "the database cannot be reached; retry later",
                    ))
                }
            }
        })?;
        if job.is_cancelled() {
            // Its requester left while it waited for the connection: nothing was sent, and
            // nothing will be (the connection goes back to the pool as it came).
            return Err(ApiError::interrupted());
        }
        // A buffered job's share of the server's budget starts once it has its connection
        // (see `engine::Buffering`): waiting for one holds nothing of it.
        crate::engine::grow(0)?;
        let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let Known {
            pid: backend,
            flights,
            driver_ages,
        } = self.backends.of(&object);
        if let Some(ages) = &driver_ages {
            // The driver's cached statements this connection stopped using are closed (ADR
            // 0068): dropping one queues its `Close` with the driver, outside any transaction.
            // The wire keeps it apart from a flight, as for any statement the driver closes: a
            // flight waits for the answers of what the driver wrote (`Wire::lend_soon`), and
            // what the driver has yet to write waits until the flight gave the socket back.
            let cold = ages
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .request();
            for sql in cold {
                object.statement_cache.remove(&sql, &[]);
            }
        }
        let cancel = object.cancel_token();
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, cancel.clone());
        Ok(Lease {
            object: Some(object),
            id,
            cancel,
            in_flight: Arc::clone(&self.in_flight),
            clean: false,
            cancel_sent: AtomicBool::new(false),
            backend: AtomicI32::new(backend),
            served_by: if self.node.is_replica() {
                ServedBy::Replica
            } else {
                ServedBy::Primary
            },
            guard: guard_name(rand::random()),
            opened: Mutex::new(None),
            fresh: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            lost_statements: AtomicBool::new(false),
            reaper: Arc::clone(&self.reaper),
            cuts: Arc::clone(&self.cuts),
            position: Arc::clone(&job.position),
            min: job.min.load(Ordering::Acquire),
            log: self.log.clone(),
            flights,
            driver_ages,
            _permit: permit,
        })
    }

    /// Rolls back a run of a request that is to run once more on `lease` (see
    /// [`Lease::take_retry`]), and resets the session its statements may have changed, in one
    /// round trip; a connection that cannot is discarded. A session that lost the driver's
    /// statements ([`Lease::lose_statements`]) is closed instead, and the request runs again
    /// on another connection, prepared afresh there too (so it does not run a third time).
    pub(super) async fn again(&self, job: &Job, mut lease: Lease) -> Result<Lease, ApiError> {
        if lease.lost_statements.load(Ordering::Acquire) {
            // Its transaction ends with the session (the lease is closed, not pooled).
            let _ = tokio::time::timeout(
                STOP_WITHIN,
                lease.client().batch_execute(session::ROLLBACK_AND_RESET),
            )
            .await;
            lease.clean = true;
            drop(lease);
            let next = self.lease(job).await?;
            next.fresh.store(true, Ordering::Release);
            return Ok(next);
        }
        let client = lease.client();
        let undone = tokio::time::timeout(STOP_WITHIN, async {
            let (rolled_back, reset) = tokio::join!(
                client.batch_execute("ROLLBACK"),
                client.batch_execute(session::RESET)
            );
            rolled_back.and(reset)
        })
        .await;
        match undone {
            Ok(Ok(())) => Ok(lease),
            Ok(Err(e)) => Err(self.map(&e)),
            // The session stalled: on a replica, the primary serves the read.
            Err(_) => Err(self.failed_here(ApiError::interrupted())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_is_named_by_its_id_in_sixteen_hex_digits() {
        for id in [0, 1, 0xa, 0xfedc_ba98_7654_3210, u64::MAX] {
            assert_eq!(guard_name(id), format!("{GUARD_PREFIX}{id:016x}"));
        }
    }
}
