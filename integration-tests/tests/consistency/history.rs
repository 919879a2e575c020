//! The recorded history of a run: every operation a session did (each attempt of it, with the
//! server it went to, the bookmark it sent and what came back) and every fault the scheduler
//! injected, on one clock. The sessions and the scheduler append; the checker reads it
//! afterwards. It must not know how operations are sent nor how faults are made.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

/// Microseconds since the run started: the one clock of the history.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(Instant);

impl Clock {
    /// A clock that reads 0 now.
    pub(crate) fn start() -> Clock {
        Clock(Instant::now())
    }

    /// Microseconds since [`Clock::start`].
    pub(crate) fn now_us(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// One HTTP attempt of an operation.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Attempt {
    /// The index of the sqlhttpd it went to.
    pub(crate) server: usize,
    pub(crate) start_us: u64,
    pub(crate) end_us: u64,
    /// The `Sqlhttp-Bookmark` sent with it, if any.
    pub(crate) sent_bookmark: Option<String>,
    pub(crate) result: AttemptResult,
}

/// What one attempt came back with.
#[derive(Debug, Clone, Serialize)]
pub(crate) enum AttemptResult {
    /// `200` with a whole body.
    Ok {
        /// The `Sqlhttp-Bookmark` of the answer, verbatim.
        bookmark: Option<String>,
        /// The `Sqlhttp-Served-By` of the answer.
        served_by: Option<String>,
        /// `Idempotent-Replayed: true`.
        replayed: bool,
    },
    /// A non-2xx status (or a streamed body that ended with an error member).
    Status {
        status: u16,
        code: String,
        message: String,
    },
    /// No answer: the connection failed, timed out, or the body ended early.
    Transport {
        kind: TransportKind,
        message: String,
    },
}

/// Why an attempt got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum TransportKind {
    /// The connection could not be made (refused, reset while connecting).
    Connect,
    /// The attempt ran past the client's timeout.
    Timeout,
    /// The connection broke after the request was sent, or the body was not whole.
    Broken,
}

/// What a write ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum WriteOutcome {
    /// A `200` came back (a first execution or a replay).
    Acknowledged,
    /// Given up after its attempts: it may or may not have been applied.
    Unknown,
    /// A final error came back: it must not have been applied.
    Refused,
}

/// Which read a session made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum ReadKind {
    /// The count and greatest seq of the session's own rows.
    Own,
    /// The count and greatest seq of every session's rows.
    All,
}

/// What a session's rows looked like to a read: how many, and the greatest seq (`-1`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Seen {
    pub(crate) count: i64,
    pub(crate) max: i64,
}

impl Seen {
    /// No rows.
    pub(crate) const NONE: Seen = Seen { count: 0, max: -1 };
}

/// One operation of one session.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Event {
    /// The session (its writes carry this number); it outlives processes across hand-overs.
    pub(crate) session: usize,
    /// The process (an HTTP client with a bookmark of its own) that made the operation.
    pub(crate) process: usize,
    pub(crate) start_us: u64,
    pub(crate) end_us: u64,
    pub(crate) op: Op,
}

/// The operation itself.
#[derive(Debug, Clone, Serialize)]
pub(crate) enum Op {
    /// A keyed insert of `(session, seq)`.
    Write {
        seq: i64,
        outcome: WriteOutcome,
        attempts: Vec<Attempt>,
    },
    /// A verified read; `seen` is `None` when every attempt failed.
    Read {
        kind: ReadKind,
        seen: Option<BTreeMap<usize, Seen>>,
        attempts: Vec<Attempt>,
    },
    /// The session's process handed its bookmark to a new process and ended.
    HandOver {
        to_process: usize,
        bookmark: Option<String>,
    },
}

/// The kinds of faults the scheduler injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) enum FaultKind {
    /// A replica cut from the primary (replication network), still reachable by sqlhttpd.
    Partition,
    /// A replica's processes frozen (`docker pause`).
    Pause,
    /// One sqlhttpd killed (SIGKILL) and started again.
    Kill,
    /// One sqlhttpd stopped gracefully (SIGTERM) and started again.
    Stop,
}

impl FaultKind {
    /// Every kind, in the order summaries list them.
    pub(crate) const ALL: [FaultKind; 4] = [
        FaultKind::Partition,
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::Stop,
    ];

    /// The kind's name in logs and summaries.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::Partition => "replica partitioned from the primary",
            FaultKind::Pause => "replica paused",
            FaultKind::Kill => "sqlhttpd killed (SIGKILL) and restarted",
            FaultKind::Stop => "sqlhttpd stopped (SIGTERM) and restarted",
        }
    }

    /// Whether the fault takes an sqlhttpd down (its errors are expected meanwhile).
    pub(crate) fn downs_a_server(self) -> bool {
        matches!(self, FaultKind::Kill | FaultKind::Stop)
    }
}

/// One injected fault, from its start to its healing.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FaultRecord {
    pub(crate) kind: FaultKind,
    /// The container it was made on.
    pub(crate) target: String,
    /// For a fault on an sqlhttpd, its index.
    pub(crate) server: Option<usize>,
    pub(crate) start_us: u64,
    /// When it was healed (for an sqlhttpd: when it answered `/readyz` again).
    pub(crate) healed_us: u64,
    /// A docker command that failed, if one did.
    pub(crate) error: Option<String>,
}

/// The history, appended to by every session and the scheduler.
#[derive(Debug, Default)]
pub(crate) struct History {
    events: Mutex<Vec<Event>>,
    faults: Mutex<Vec<FaultRecord>>,
}

impl History {
    /// Appends one operation.
    pub(crate) fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(event);
    }

    /// Appends one fault.
    pub(crate) fn push_fault(&self, fault: FaultRecord) {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(fault);
    }

    /// Everything recorded, events in the order they completed.
    pub(crate) fn take(&self) -> (Vec<Event>, Vec<FaultRecord>) {
        let events = std::mem::take(
            &mut *self
                .events
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let faults = std::mem::take(
            &mut *self
                .faults
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        (events, faults)
    }
}
