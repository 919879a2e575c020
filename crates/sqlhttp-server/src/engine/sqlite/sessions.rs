//! [`Sessions`]: the engine's open interactive transactions as its watchdog sees them (ADR 0032,
//! ADR 0042). Each transaction's thread enlists a [`Watched`] and publishes there the step it
//! runs (its `JobControl` and how to answer its requester), as a pool's connection does; the
//! watchdog's [`Sessions::watch`] then
//!
//! - **gives up a step** that has had to stop (its deadline, the engine's close) for the margin
//!   and has neither committed nor finished, through the same `JobControl::give_up` as a pool's
//!   job (so a COMMIT whose hook won is never reported failed): its requester is answered at
//!   once, the statement is interrupted, the write permit the transaction held is released, and
//!   the thread is counted as a stray (`Strays`, the engine's one cap) until its statement ends,
//!   when it rolls back and closes its connection;
//! - **ends a transaction the engine may not keep** (the thread rolls it back at once if it is
//!   idle, else after its statement): a write transaction idle (no statement running) past
//!   `--transaction-write-idle`, so SQLite's one writer is never held by a client that is not
//!   using it; a read-only transaction open past [`READ_GRACE`] while the write-ahead log is past
//!   its truncate threshold, and any transaction while it is past its hard bound (ADR 0046), so
//!   no snapshot and no write lock keeps the log from being truncated; every transaction once
//!   the engine closes.
//!
//! How many statements of transactions run at once, stuck ones included, is bounded by
//! [`Sessions::statements`]: a given-up step keeps its permit until its statement really ends.
//!
//! Knows threads, the job's fate, SQLite's interrupt and the log file's size; nothing about SQL,
//! HTTP, tokens or the registry of transactions (`crate::transactions`), which learns that the
//! engine ended one through `Session::must_end`.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::InterruptHandle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::engine::Access;
use crate::engine::sqlite::control::JobControl;
use crate::engine::sqlite::wal::{Level, WalBound};
use crate::engine::sqlite::worker::{Answer, Strays};

/// How long a read-only transaction may keep its snapshot once the write-ahead log is past its
/// bound: about what a plain read's statement gets before the checkpoint that follows it.
pub(crate) const READ_GRACE: Duration = Duration::from_secs(1);

/// Why the engine ended a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// A write transaction idle past `--transaction-write-idle`.
    WriteIdle,
    /// A read-only transaction whose snapshot held the write-ahead log past its bound.
    Wal,
    /// The engine is closing.
    Closing,
    /// A write transaction open while the write-ahead log passed its hard bound.
    WalFull,
}

impl Ended {
    fn to_u8(self) -> u8 {
        match self {
            Ended::WriteIdle => 1,
            Ended::Wal => 2,
            Ended::Closing => 3,
            Ended::WalFull => 4,
        }
    }

    fn from_u8(value: u8) -> Option<Ended> {
        match value {
            1 => Some(Ended::WriteIdle),
            2 => Some(Ended::Wal),
            3 => Some(Ended::Closing),
            4 => Some(Ended::WalFull),
            _ => None,
        }
    }
}

/// The step a transaction's thread runs now.
struct Running {
    control: Arc<JobControl>,
    answer: Answer,
}

/// One transaction's thread, as the watchdog sees it.
pub(crate) struct Watched {
    access: Access,
    opened_at: Instant,
    interrupt: InterruptHandle,
    running: Mutex<Option<Running>>,
    /// Since when no command has run; `None` while one runs.
    idle_since: Mutex<Option<Instant>>,
    /// Why the engine ended it (an [`Ended`]), 0 while it may go on.
    ended: AtomicU8,
    /// Tells the thread to look at [`Watched::ended`] now.
    wake: Box<dyn Fn() + Send + Sync>,
    /// The engine's write permit, for a write transaction: released when the thread ends, or at
    /// once when its step is given up.
    writer: Mutex<Option<OwnedSemaphorePermit>>,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("access", &self.access)
            .field("ended", &self.ended())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Watched {
    /// Why the engine ended the transaction, if it did.
    pub(crate) fn ended(&self) -> Option<Ended> {
        Ended::from_u8(self.ended.load(Ordering::Acquire))
    }

    /// Publishes the step the thread starts now, answered by `answer` if it is given up.
    pub(crate) fn start(&self, control: Arc<JobControl>, answer: Answer) {
        *lock(&self.idle_since) = None;
        *lock(&self.running) = Some(Running { control, answer });
    }

    /// The thread is done with its step; `false` if the watchdog gave it up (and answered it).
    pub(crate) fn stop(&self) -> bool {
        let mine = lock(&self.running).take().is_some();
        *lock(&self.idle_since) = Some(Instant::now());
        mine
    }

    /// A command other than a step arrived: the transaction is not idle.
    pub(crate) fn busy(&self) {
        *lock(&self.idle_since) = None;
    }

    /// Why the engine must end the transaction at `now`, if it must.
    fn due(&self, now: Instant, closing: bool, wal: Level, write_idle: Duration) -> Option<Ended> {
        if closing {
            return Some(Ended::Closing);
        }
        match self.access {
            Access::ReadWrite if wal == Level::PastHard => Some(Ended::WalFull),
            Access::ReadWrite => lock(&self.idle_since)
                .is_some_and(|since| now.saturating_duration_since(since) >= write_idle)
                .then_some(Ended::WriteIdle),
            Access::ReadOnly => (wal == Level::PastHard
                || (wal == Level::PastThreshold
                    && now.saturating_duration_since(self.opened_at) >= READ_GRACE))
                .then_some(Ended::Wal),
        }
    }

    /// Ends the transaction for `why` unless the engine ended it already; whether this did.
    fn end(&self, why: Ended) -> bool {
        self.ended
            .compare_exchange(0, why.to_u8(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// The engine's transactions' threads, for its watchdog.
pub(crate) struct Sessions {
    list: Mutex<Vec<Arc<Watched>>>,
    strays: Arc<Strays>,
    give_up_after: Duration,
    write_idle: Duration,
    /// The write-ahead log's bounds.
    wal: Arc<WalBound>,
    /// Statements of transactions that may run at once, given-up ones included.
    statements: Arc<Semaphore>,
    /// The transactions' connections' "closing" (their hooks stop every statement).
    closing: Arc<AtomicBool>,
    closing_since: OnceLock<Instant>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("open", &lock(&self.list).len())
            .finish_non_exhaustive()
    }
}

/// A transaction's thread's place in [`Sessions`]: leaves it when dropped (the thread ends),
/// releasing the write permit and, for a given-up thread, its count as a stray.
pub(crate) struct Enlisted {
    sessions: Arc<Sessions>,
    watched: Arc<Watched>,
    stray: bool,
}

impl Enlisted {
    pub(crate) fn watched(&self) -> &Arc<Watched> {
        &self.watched
    }

    /// The step the thread ran was given up: it ends as a stray.
    pub(crate) fn given_up(&mut self) {
        self.stray = true;
    }

    /// Whether the write-ahead log is past its hard bound now, read from the file right before
    /// a write transaction's statement runs: the transaction is then ended ([`Ended::WalFull`])
    /// instead, as the watchdog would end it at its next look (ADR 0046).
    pub(crate) fn wal_full(&self) -> bool {
        self.sessions.wal.past_hard() && {
            self.watched.end(Ended::WalFull);
            true
        }
    }
}

impl Drop for Enlisted {
    fn drop(&mut self) {
        lock(&self.sessions.list).retain(|w| !Arc::ptr_eq(w, &self.watched));
        lock(&self.watched.writer).take();
        if self.stray {
            self.sessions.strays.ended();
            tracing::info!("a given-up transaction's statement ended; its connection is closed");
        }
    }
}

impl Sessions {
    /// No transaction yet. `statements` of them run at once, stuck ones included.
    pub(crate) fn new(
        strays: Arc<Strays>,
        give_up_after: Duration,
        write_idle: Duration,
        wal: Arc<WalBound>,
        statements: usize,
    ) -> Sessions {
        Sessions {
            list: Mutex::new(Vec::new()),
            strays,
            give_up_after,
            write_idle,
            wal,
            statements: Arc::new(Semaphore::new(statements.max(1))),
            closing: Arc::new(AtomicBool::new(false)),
            closing_since: OnceLock::new(),
        }
    }

    /// The flag the transactions' connections' hooks read as "the engine is closing".
    pub(crate) fn closing_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.closing)
    }

    /// Whether the transactions are being closed.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The write-ahead log's bounds.
    pub(crate) fn wal(&self) -> &Arc<WalBound> {
        &self.wal
    }

    /// The permits a step takes before it runs.
    pub(crate) fn statements(&self) -> &Arc<Semaphore> {
        &self.statements
    }

    /// Stops every transaction's statement (at its next jump; given up [`Sessions::watch`]'s
    /// margin later) and ends every transaction: the server is shutting down.
    pub(crate) fn close(&self) {
        self.closing_since.get_or_init(Instant::now);
        self.closing.store(true, Ordering::Release);
        self.watch(Instant::now());
    }

    /// Whether no transaction's thread is left but given-up ones (after [`Sessions::close`]).
    pub(crate) fn settled(&self) -> bool {
        lock(&self.list).is_empty()
    }

    /// Enlists a transaction's thread: its connection's `interrupt`, how to `wake` it, and
    /// the engine's write permit it holds (a write transaction).
    pub(crate) fn enlist(
        self: &Arc<Self>,
        access: Access,
        interrupt: InterruptHandle,
        wake: Box<dyn Fn() + Send + Sync>,
        writer: Option<OwnedSemaphorePermit>,
    ) -> Enlisted {
        let watched = Arc::new(Watched {
            access,
            opened_at: Instant::now(),
            interrupt,
            running: Mutex::new(None),
            idle_since: Mutex::new(Some(Instant::now())),
            ended: AtomicU8::new(0),
            wake,
            writer: Mutex::new(writer),
        });
        lock(&self.list).push(Arc::clone(&watched));
        Enlisted {
            sessions: Arc::clone(self),
            watched,
            stray: false,
        }
    }

    /// The watchdog's look at `now`: gives up every step that has had to stop for the margin
    /// and is still running, and ends the transactions the engine may not keep (see the
    /// module's documentation).
    pub(crate) fn watch(&self, now: Instant) {
        let closing_since = self.closing_since.get().copied();
        let closing = closing_since.is_some();
        // The log's size is looked at every time: the gates of writes and read-only opens
        // follow it too (ADR 0046).
        let wal = if closing {
            Level::Under
        } else {
            self.wal.look()
        };
        let mut given_up = Vec::new();
        let mut due = Vec::new();
        lock(&self.list).retain(|watched| {
            let mut running = lock(&watched.running);
            let overdue = running.as_ref().is_some_and(|job| {
                job.control.overdue(now, closing_since, self.give_up_after) && job.control.give_up()
            });
            if let Some(job) = running.take_if(|_| overdue) {
                // Counted while the running job is locked: the thread, which learns it was
                // given up under the same lock, uncounts it only after this.
                self.strays.given_up(1);
                given_up.push((Arc::clone(watched), job));
                return false;
            }
            drop(running);
            if watched.ended().is_none()
                && let Some(why) = watched.due(now, closing, wal, self.write_idle)
            {
                due.push((Arc::clone(watched), why));
            }
            true
        });
        for (watched, job) in given_up {
            // The statement stops at its next jump; the thread then rolls back and ends.
            watched.interrupt.interrupt();
            lock(&watched.writer).take();
            job.control.note_stop(closing);
            let err = job.control.interrupted_error();
            tracing::warn!(
                code = err.code.as_str(),
                margin_ms = u64::try_from(self.give_up_after.as_millis()).unwrap_or(u64::MAX),
                "a transaction's statement did not stop in time; the transaction is given up"
            );
            (job.answer)(err);
        }
        for (watched, why) in due {
            if watched.end(why) {
                tracing::debug!(why = ?why, "the engine ends an interactive transaction");
                (watched.wake)();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::protocol::error::{ApiError, ErrorCode};

    const WRITE_IDLE: Duration = Duration::from_secs(2);

    /// The hard bound of the logs here; the truncate threshold is a quarter of it.
    const MAX_WAL: u64 = 16 * 1024 * 1024;

    fn sessions(wal: PathBuf) -> (Arc<Sessions>, Arc<Strays>) {
        let wal = Arc::new(WalBound::new(wal, MAX_WAL));
        let strays = Arc::new(Strays::new(1));
        let sessions = Arc::new(Sessions::new(
            Arc::clone(&strays),
            Duration::ZERO,
            WRITE_IDLE,
            wal,
            1,
        ));
        (sessions, strays)
    }

    /// Enlists a transaction whose wake-ups are counted.
    fn enlist(sessions: &Arc<Sessions>, access: Access) -> (Enlisted, Arc<AtomicUsize>) {
        let woken = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&woken);
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let enlisted = sessions.enlist(
            access,
            conn.get_interrupt_handle(),
            Box::new(move || {
                count.fetch_add(1, Ordering::AcqRel);
            }),
            None,
        );
        (enlisted, woken)
    }

    #[test]
    fn an_idle_write_transaction_is_ended_once_and_a_busy_one_is_not() {
        let (sessions, _) = sessions(PathBuf::from("/nonexistent/wal"));
        let (write, woken) = enlist(&sessions, Access::ReadWrite);
        let (read, read_woken) = enlist(&sessions, Access::ReadOnly);
        let now = Instant::now();
        sessions.watch(now + WRITE_IDLE / 2);
        assert_eq!(
            write.watched().ended(),
            None,
            "idle for less than the bound"
        );
        // A step runs: not idle, however long it takes (its timeout bounds it).
        write
            .watched()
            .start(Arc::new(JobControl::default()), Box::new(|_| {}));
        sessions.watch(now + WRITE_IDLE * 3);
        assert_eq!(write.watched().ended(), None, "ended while a statement ran");
        assert!(write.watched().stop());
        let stopped = Instant::now();
        sessions.watch(stopped + WRITE_IDLE);
        sessions.watch(stopped + WRITE_IDLE * 2);
        assert_eq!(write.watched().ended(), Some(Ended::WriteIdle));
        assert_eq!(woken.load(Ordering::Acquire), 1, "woken once");
        // A read-only transaction has no write-idle bound, and the log is small (absent).
        assert_eq!(read.watched().ended(), None);
        assert_eq!(read_woken.load(Ordering::Acquire), 0);
    }

    #[test]
    fn read_only_transactions_older_than_the_grace_end_while_the_log_is_over_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("db-wal");
        let (sessions, _) = sessions(wal.clone());
        let (read, woken) = enlist(&sessions, Access::ReadOnly);
        let now = Instant::now();
        sessions.watch(now + READ_GRACE * 2);
        assert_eq!(read.watched().ended(), None, "no log yet");
        let file = std::fs::File::create(&wal).unwrap();
        file.set_len(MAX_WAL / 4 + 1).unwrap();
        sessions.watch(now);
        assert_eq!(read.watched().ended(), None, "younger than the grace");
        sessions.watch(now + READ_GRACE * 2);
        assert_eq!(read.watched().ended(), Some(Ended::Wal));
        assert_eq!(woken.load(Ordering::Acquire), 1);
    }

    #[test]
    fn past_the_hard_bound_every_transaction_is_ended_whatever_its_age() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("db-wal");
        let (sessions, _) = sessions(wal.clone());
        let (read, _) = enlist(&sessions, Access::ReadOnly);
        let (write, woken) = enlist(&sessions, Access::ReadWrite);
        let file = std::fs::File::create(&wal).unwrap();
        file.set_len(MAX_WAL / 4 + 1).unwrap();
        let now = Instant::now();
        sessions.watch(now);
        assert_eq!(read.watched().ended(), None, "younger than the grace");
        assert_eq!(
            write.watched().ended(),
            None,
            "writes go on past the threshold"
        );
        assert!(!write.wal_full());
        file.set_len(MAX_WAL + 1).unwrap();
        assert!(write.wal_full(), "the writer's own look sees the bound");
        assert_eq!(write.watched().ended(), Some(Ended::WalFull));
        sessions.watch(now);
        assert_eq!(
            read.watched().ended(),
            Some(Ended::Wal),
            "young, but past the hard bound"
        );
        // The thread had ended itself: the watchdog does not wake it again.
        assert_eq!(woken.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_given_up_step_is_answered_counted_and_uncounted_when_its_thread_ends() {
        let (sessions, strays) = sessions(PathBuf::from("/nonexistent/wal"));
        let (mut enlisted, _) = enlist(&sessions, Access::ReadOnly);
        let job = Arc::new(JobControl::default());
        job.start(Duration::ZERO);
        let answered = Arc::new(Mutex::new(None::<ApiError>));
        let answer = Arc::clone(&answered);
        enlisted.watched().start(
            Arc::clone(&job),
            Box::new(move |err| *lock(&answer) = Some(err)),
        );
        sessions.watch(Instant::now());
        let err = lock(&answered).take().expect("the requester was answered");
        assert_eq!(err.code, ErrorCode::StatementTimeout);
        assert!(job.is_given_up());
        assert_eq!((strays.alive(), strays.total()), (1, 1));
        assert!(sessions.settled(), "a given-up thread is not waited for");
        // The thread learns it was given up when its statement ends, and ends as a stray.
        assert!(!job.finish());
        assert!(!enlisted.watched().stop());
        enlisted.given_up();
        drop(enlisted);
        assert_eq!((strays.alive(), strays.total()), (0, 1));
    }

    #[test]
    fn a_step_whose_commit_won_is_not_given_up() {
        let (sessions, strays) = sessions(PathBuf::from("/nonexistent/wal"));
        let (enlisted, _) = enlist(&sessions, Access::ReadWrite);
        let job = Arc::new(JobControl::default());
        job.start(Duration::ZERO);
        enlisted.watched().start(
            Arc::clone(&job),
            Box::new(|_| panic!("answered as given up")),
        );
        assert!(job.claim_commit());
        sessions.watch(Instant::now());
        assert!(!job.is_given_up());
        assert_eq!(strays.total(), 0);
        assert!(job.finish());
        assert!(enlisted.watched().stop());
    }

    #[test]
    fn closing_ends_every_transaction() {
        let (sessions, _) = sessions(PathBuf::from("/nonexistent/wal"));
        let (read, read_woken) = enlist(&sessions, Access::ReadOnly);
        let (write, write_woken) = enlist(&sessions, Access::ReadWrite);
        assert!(!sessions.is_closing());
        sessions.close();
        assert!(sessions.is_closing());
        assert!(sessions.closing_flag().load(Ordering::Acquire));
        for (enlisted, woken) in [(&read, &read_woken), (&write, &write_woken)] {
            assert_eq!(enlisted.watched().ended(), Some(Ended::Closing));
            assert_eq!(woken.load(Ordering::Acquire), 1);
        }
        assert!(!sessions.settled());
        drop((read, write));
        assert!(sessions.settled());
    }
}
