//! The checker: reads a recorded [history](crate::history) and the final table (as the primary
//! holds it) and names every anomaly. Pure: no I/O, no clock, so its rules are tested on
//! histories written by hand. It must not know how the history was made.
//!
//! The rules:
//! * every acknowledged write is in the table exactly once; a write whose outcome is unknown at
//!   most once; a refused write not at all; no row that no session wrote;
//! * within a session, across the processes it handed its bookmark to, no read returns fewer of
//!   the session's rows (or a lower seq) than it had acknowledged (read-your-writes), nor fewer
//!   of any session's rows than an earlier read of it returned (monotonic reads);
//! * no read returns a row whose write had not started when the read ended;
//! * reads never fail because a replica did: an attempt that fails counts as an anomaly unless
//!   it went to an sqlhttpd the scheduler had taken down (from the fault's start to
//!   [`RESTART_GRACE_US`] after it answered `/readyz` again), which is classified apart;
//! * every bookmark a server sent is 16 hex digits.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::history::{
    Attempt, AttemptResult, Event, FaultRecord, Op, ReadKind, Seen, WriteOutcome,
};

/// How long after an sqlhttpd answered `/readyz` again its errors still count as the restart's:
/// a client's pooled connection to the old process may fail once after that.
pub(crate) const RESTART_GRACE_US: u64 = 2_000_000;

/// What an anomaly breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum AnomalyKind {
    /// An acknowledged write is not in the table.
    LostWrite,
    /// A write is in the table more than once.
    DuplicateWrite,
    /// A refused write is in the table, or a row no session wrote.
    PhantomRow,
    /// A write was refused with a final error (the workload never sends a wrong one).
    WriteRefused,
    /// A read returned less of the session's own rows than it had acknowledged.
    ReadYourWrites,
    /// A read returned less than an earlier read of the same session (or the process that
    /// handed it its bookmark) had seen.
    MonotonicReads,
    /// A read returned a row whose write had not started yet.
    PhantomRead,
    /// A read attempt failed while its sqlhttpd was up.
    ReadFailed,
    /// A response carried a bookmark that is not 16 hex digits.
    MalformedBookmark,
}

impl AnomalyKind {
    /// The kind's name in summaries.
    pub(crate) fn name(self) -> &'static str {
        match self {
            AnomalyKind::LostWrite => "acknowledged write lost",
            AnomalyKind::DuplicateWrite => "write applied twice",
            AnomalyKind::PhantomRow => "row nobody wrote (or a refused write applied)",
            AnomalyKind::WriteRefused => "write refused with a final error",
            AnomalyKind::ReadYourWrites => "read-your-writes violated",
            AnomalyKind::MonotonicReads => "monotonic reads violated",
            AnomalyKind::PhantomRead => "read saw a write that had not started",
            AnomalyKind::ReadFailed => "read failed while its sqlhttpd was up",
            AnomalyKind::MalformedBookmark => "malformed bookmark",
        }
    }
}

/// One anomaly, with what the checker saw.
#[derive(Debug, Clone)]
pub(crate) struct Anomaly {
    pub(crate) kind: AnomalyKind,
    pub(crate) session: Option<usize>,
    pub(crate) at_us: u64,
    pub(crate) detail: String,
}

/// The verdict on a history.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) anomalies: Vec<Anomaly>,
    /// Read attempts that failed on an sqlhttpd the scheduler had taken down.
    pub(crate) read_errors_during_restarts: usize,
    /// Write attempts that failed on an sqlhttpd the scheduler had taken down (retried).
    pub(crate) write_errors_during_restarts: usize,
    /// Write attempts that failed while their sqlhttpd was up (retried; not an anomaly by
    /// itself: the final table says whether the write landed once).
    pub(crate) write_errors_outside_restarts: usize,
    /// Reads checked after a hand-over, before the new process's next write.
    pub(crate) reads_after_hand_over: usize,
}

/// Whether `text` is a bookmark as the protocol defines it (16 hex digits; upper case allowed).
pub(crate) fn parse_bookmark(text: &str) -> Option<u64> {
    if text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        u64::from_str_radix(text, 16).ok()
    } else {
        None
    }
}

/// The windows in which each sqlhttpd was down: `(server, from_us, to_us)`.
fn down_windows(faults: &[FaultRecord]) -> Vec<(usize, u64, u64)> {
    faults
        .iter()
        .filter(|fault| fault.kind.downs_a_server())
        .filter_map(|fault| {
            fault.server.map(|server| {
                (
                    server,
                    fault.start_us,
                    fault.healed_us.saturating_add(RESTART_GRACE_US),
                )
            })
        })
        .collect()
}

fn during_restart(windows: &[(usize, u64, u64)], attempt: &Attempt) -> bool {
    windows.iter().any(|&(server, from, to)| {
        server == attempt.server && attempt.start_us <= to && attempt.end_us >= from
    })
}

/// When each write `(session, seq)` first started.
fn write_starts(events: &[Event]) -> HashMap<(usize, i64), u64> {
    let mut starts = HashMap::new();
    for event in events {
        if let Op::Write { seq, .. } = &event.op {
            starts.insert((event.session, *seq), event.start_us);
        }
    }
    starts
}

/// What one session has acknowledged and seen so far, carried across its hand-overs.
#[derive(Debug, Default)]
struct Knowledge {
    acknowledged: i64,
    acknowledged_max: i64,
    seen: BTreeMap<usize, Seen>,
    after_hand_over: bool,
}

/// Checks `events` and `faults` against `table`, the count of rows of each `(session, seq)` the
/// primary holds at the end.
pub(crate) fn check(
    events: &[Event],
    faults: &[FaultRecord],
    table: &BTreeMap<(usize, i64), u64>,
) -> Verdict {
    let mut verdict = Verdict::default();
    let windows = down_windows(faults);
    let starts = write_starts(events);
    check_attempts(events, &windows, &mut verdict);
    check_table(events, table, &mut verdict);

    let mut sessions: BTreeMap<usize, Vec<&Event>> = BTreeMap::new();
    for event in events {
        sessions.entry(event.session).or_default().push(event);
    }
    for (session, mut ops) in sessions {
        ops.sort_by_key(|event| event.start_us);
        let mut knowledge = Knowledge {
            acknowledged_max: -1,
            ..Knowledge::default()
        };
        for event in ops {
            match &event.op {
                Op::Write { seq, outcome, .. } => {
                    if *outcome == WriteOutcome::Acknowledged {
                        knowledge.acknowledged += 1;
                        knowledge.acknowledged_max = knowledge.acknowledged_max.max(*seq);
                    }
                    knowledge.after_hand_over = false;
                }
                Op::Read {
                    kind,
                    seen: Some(seen),
                    ..
                } => check_read(
                    session,
                    event,
                    *kind,
                    seen,
                    &starts,
                    &mut knowledge,
                    &mut verdict,
                ),
                Op::Read { seen: None, .. } => {}
                Op::HandOver { .. } => knowledge.after_hand_over = true,
            }
        }
    }
    verdict.anomalies.sort_by_key(|anomaly| anomaly.at_us);
    verdict
}

fn check_attempts(events: &[Event], windows: &[(usize, u64, u64)], verdict: &mut Verdict) {
    for event in events {
        let (attempts, is_read) = match &event.op {
            Op::Write { attempts, .. } => (attempts, false),
            Op::Read { attempts, .. } => (attempts, true),
            Op::HandOver { .. } => continue,
        };
        for attempt in attempts {
            match &attempt.result {
                AttemptResult::Ok {
                    bookmark: Some(bookmark),
                    ..
                } if parse_bookmark(bookmark).is_none() => verdict.anomalies.push(Anomaly {
                    kind: AnomalyKind::MalformedBookmark,
                    session: Some(event.session),
                    at_us: attempt.end_us,
                    detail: format!("server {} sent {bookmark:?}", attempt.server),
                }),
                AttemptResult::Ok { .. } => {}
                failure => {
                    let restart = during_restart(windows, attempt);
                    match (is_read, restart) {
                        (true, true) => verdict.read_errors_during_restarts += 1,
                        (false, true) => verdict.write_errors_during_restarts += 1,
                        (false, false) => verdict.write_errors_outside_restarts += 1,
                        (true, false) => verdict.anomalies.push(Anomaly {
                            kind: AnomalyKind::ReadFailed,
                            session: Some(event.session),
                            at_us: attempt.end_us,
                            detail: format!(
                                "server {} ({} ms): {}",
                                attempt.server,
                                (attempt.end_us - attempt.start_us) / 1000,
                                describe(failure)
                            ),
                        }),
                    }
                }
            }
        }
        if let Op::Write {
            seq,
            outcome: WriteOutcome::Refused,
            attempts,
        } = &event.op
        {
            let last = attempts
                .last()
                .map_or_else(String::new, |a| describe(&a.result));
            verdict.anomalies.push(Anomaly {
                kind: AnomalyKind::WriteRefused,
                session: Some(event.session),
                at_us: event.end_us,
                detail: format!("write ({}, {seq}): {last}", event.session),
            });
        }
    }
}

/// A failed attempt in a line.
pub(crate) fn describe(result: &AttemptResult) -> String {
    match result {
        AttemptResult::Ok { .. } => "ok".to_owned(),
        AttemptResult::Status {
            status,
            code,
            message,
        } => format!("{status} {code}: {message}"),
        AttemptResult::Transport { kind, message } => format!("{kind:?}: {message}"),
    }
}

fn check_table(events: &[Event], table: &BTreeMap<(usize, i64), u64>, verdict: &mut Verdict) {
    let mut outcomes: HashMap<(usize, i64), (WriteOutcome, u64)> = HashMap::new();
    for event in events {
        if let Op::Write { seq, outcome, .. } = &event.op {
            outcomes.insert((event.session, *seq), (*outcome, event.end_us));
        }
    }
    let mut keys: Vec<_> = outcomes.keys().copied().collect();
    keys.sort_unstable();
    for key in keys {
        let (outcome, at_us) = outcomes[&key];
        let present = table.get(&key).copied().unwrap_or(0);
        let (kind, wrong) = match outcome {
            WriteOutcome::Acknowledged if present == 0 => (AnomalyKind::LostWrite, true),
            WriteOutcome::Refused if present > 0 => (AnomalyKind::PhantomRow, true),
            _ if present > 1 => (AnomalyKind::DuplicateWrite, true),
            _ => (AnomalyKind::LostWrite, false),
        };
        if wrong {
            verdict.anomalies.push(Anomaly {
                kind,
                session: Some(key.0),
                at_us,
                detail: format!(
                    "write ({}, {}) {outcome:?}: {present} rows in the table",
                    key.0, key.1
                ),
            });
        }
    }
    for (&(session, seq), &count) in table {
        if !outcomes.contains_key(&(session, seq)) {
            verdict.anomalies.push(Anomaly {
                kind: AnomalyKind::PhantomRow,
                session: Some(session),
                at_us: u64::MAX,
                detail: format!("({session}, {seq}) is in the table {count} times, never written"),
            });
        }
    }
}

fn check_read(
    session: usize,
    event: &Event,
    kind: ReadKind,
    seen: &BTreeMap<usize, Seen>,
    starts: &HashMap<(usize, i64), u64>,
    knowledge: &mut Knowledge,
    verdict: &mut Verdict,
) {
    let process = event.process;
    let context = if knowledge.after_hand_over {
        verdict.reads_after_hand_over += 1;
        format!("process {process}, the first after a hand-over")
    } else {
        format!("process {process}")
    };
    let mut push = |anomaly: AnomalyKind, detail: String| {
        verdict.anomalies.push(Anomaly {
            kind: anomaly,
            session: Some(session),
            at_us: event.end_us,
            detail: format!("{detail} ({context}, {kind:?} read)"),
        });
    };
    // A session absent from the answer has no rows.
    let own = seen.get(&session).copied().unwrap_or(Seen::NONE);
    if own.count < knowledge.acknowledged || own.max < knowledge.acknowledged_max {
        push(
            AnomalyKind::ReadYourWrites,
            format!(
                "saw {} own rows up to seq {} after {} acknowledged up to seq {}",
                own.count, own.max, knowledge.acknowledged, knowledge.acknowledged_max
            ),
        );
    }
    let compared: BTreeSet<usize> = match kind {
        ReadKind::Own => BTreeSet::from([session]),
        ReadKind::All => knowledge.seen.keys().chain(seen.keys()).copied().collect(),
    };
    for other in compared {
        let now = seen.get(&other).copied().unwrap_or(Seen::NONE);
        let before = knowledge.seen.get(&other).copied().unwrap_or(Seen::NONE);
        if now.count < before.count || now.max < before.max {
            push(
                AnomalyKind::MonotonicReads,
                format!(
                    "saw session {other} at {} rows up to seq {} after {} rows up to seq {}",
                    now.count, now.max, before.count, before.max
                ),
            );
        }
        if now.max >= 0 {
            let started = starts.get(&(other, now.max)).copied();
            if started.is_none_or(|start| start > event.end_us) {
                push(
                    AnomalyKind::PhantomRead,
                    format!(
                        "saw session {other}'s seq {} before its write started",
                        now.max
                    ),
                );
            }
        }
        let entry = knowledge.seen.entry(other).or_insert(Seen::NONE);
        entry.count = entry.count.max(now.count);
        entry.max = entry.max.max(now.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{FaultKind, TransportKind};

    fn ok(server: usize, at: u64) -> Attempt {
        Attempt {
            server,
            start_us: at,
            end_us: at + 10,
            sent_bookmark: None,
            result: AttemptResult::Ok {
                bookmark: Some("0000000001000028".to_owned()),
                served_by: Some("replica".to_owned()),
                replayed: false,
            },
        }
    }

    fn refused_connection(server: usize, at: u64) -> Attempt {
        Attempt {
            result: AttemptResult::Transport {
                kind: TransportKind::Connect,
                message: "connection refused".to_owned(),
            },
            ..ok(server, at)
        }
    }

    fn write(session: usize, process: usize, at: u64, seq: i64, outcome: WriteOutcome) -> Event {
        Event {
            session,
            process,
            start_us: at,
            end_us: at + 10,
            op: Op::Write {
                seq,
                outcome,
                attempts: vec![ok(0, at)],
            },
        }
    }

    fn read(
        session: usize,
        process: usize,
        at: u64,
        kind: ReadKind,
        seen: &[(usize, i64, i64)],
    ) -> Event {
        Event {
            session,
            process,
            start_us: at,
            end_us: at + 10,
            op: Op::Read {
                kind,
                seen: Some(
                    seen.iter()
                        .map(|&(s, count, max)| (s, Seen { count, max }))
                        .collect(),
                ),
                attempts: vec![ok(1, at)],
            },
        }
    }

    fn hand_over(session: usize, process: usize, at: u64, to: usize) -> Event {
        Event {
            session,
            process,
            start_us: at,
            end_us: at,
            op: Op::HandOver {
                to_process: to,
                bookmark: Some("0000000001000028".to_owned()),
            },
        }
    }

    fn table(rows: &[(usize, i64, u64)]) -> BTreeMap<(usize, i64), u64> {
        rows.iter().map(|&(s, q, n)| ((s, q), n)).collect()
    }

    fn kinds(verdict: &Verdict) -> Vec<AnomalyKind> {
        verdict.anomalies.iter().map(|a| a.kind).collect()
    }

    #[test]
    fn a_consistent_history_has_no_anomaly() {
        let events = vec![
            write(0, 0, 100, 0, WriteOutcome::Acknowledged),
            read(0, 0, 200, ReadKind::Own, &[(0, 1, 0)]),
            write(1, 1, 150, 0, WriteOutcome::Acknowledged),
            read(1, 1, 300, ReadKind::All, &[(0, 1, 0), (1, 1, 0)]),
            hand_over(1, 1, 400, 2),
            read(1, 2, 500, ReadKind::All, &[(0, 1, 0), (1, 1, 0)]),
        ];
        let verdict = check(&events, &[], &table(&[(0, 0, 1), (1, 0, 1)]));
        assert_eq!(kinds(&verdict), vec![]);
        assert_eq!(verdict.reads_after_hand_over, 1);
    }

    #[test]
    fn a_read_missing_an_acknowledged_write_breaks_read_your_writes() {
        let events = vec![
            write(0, 0, 100, 0, WriteOutcome::Acknowledged),
            write(0, 0, 200, 1, WriteOutcome::Acknowledged),
            read(0, 0, 300, ReadKind::Own, &[(0, 1, 0)]),
        ];
        let verdict = check(&events, &[], &table(&[(0, 0, 1), (0, 1, 1)]));
        assert_eq!(kinds(&verdict), vec![AnomalyKind::ReadYourWrites]);
    }

    #[test]
    fn a_read_older_than_an_earlier_one_breaks_monotonic_reads_across_a_hand_over() {
        let events = vec![
            write(1, 1, 50, 0, WriteOutcome::Acknowledged),
            write(1, 1, 60, 1, WriteOutcome::Acknowledged),
            read(0, 0, 100, ReadKind::All, &[(1, 2, 1)]),
            hand_over(0, 0, 200, 5),
            // The new process sees session 1 as it was before.
            read(0, 5, 300, ReadKind::All, &[(1, 1, 0)]),
        ];
        let verdict = check(&events, &[], &table(&[(1, 0, 1), (1, 1, 1)]));
        assert_eq!(kinds(&verdict), vec![AnomalyKind::MonotonicReads]);
        assert!(verdict.anomalies[0].detail.contains("after a hand-over"));
    }

    #[test]
    fn a_session_missing_from_a_later_answer_went_back_in_time() {
        let events = vec![
            write(1, 1, 50, 0, WriteOutcome::Acknowledged),
            read(0, 0, 100, ReadKind::All, &[(1, 1, 0)]),
            read(0, 0, 200, ReadKind::All, &[]),
        ];
        let verdict = check(&events, &[], &table(&[(1, 0, 1)]));
        assert_eq!(kinds(&verdict), vec![AnomalyKind::MonotonicReads]);
    }

    #[test]
    fn the_table_must_hold_each_acknowledged_write_once_and_unknown_ones_at_most_once() {
        let events = vec![
            write(0, 0, 100, 0, WriteOutcome::Acknowledged),
            write(0, 0, 200, 1, WriteOutcome::Acknowledged),
            write(0, 0, 300, 2, WriteOutcome::Unknown),
            write(0, 0, 400, 3, WriteOutcome::Unknown),
            write(0, 0, 500, 4, WriteOutcome::Unknown),
        ];
        // seq 0 lost, seq 1 twice, seq 2 absent (fine), seq 3 once (fine), seq 4 twice, seq 9 never written.
        let rows = table(&[(0, 1, 2), (0, 3, 1), (0, 4, 2), (0, 9, 1)]);
        let verdict = check(&events, &[], &rows);
        let mut got = kinds(&verdict);
        got.sort();
        assert_eq!(
            got,
            vec![
                AnomalyKind::LostWrite,
                AnomalyKind::DuplicateWrite,
                AnomalyKind::DuplicateWrite,
                AnomalyKind::PhantomRow
            ]
        );
    }

    #[test]
    fn a_read_of_a_write_not_yet_started_is_a_phantom() {
        let events = vec![
            read(0, 0, 100, ReadKind::All, &[(1, 1, 0)]),
            write(1, 1, 500, 0, WriteOutcome::Acknowledged),
        ];
        let verdict = check(&events, &[], &table(&[(1, 0, 1)]));
        assert_eq!(kinds(&verdict), vec![AnomalyKind::PhantomRead]);
    }

    #[test]
    fn read_errors_count_as_anomalies_unless_their_sqlhttpd_was_down() {
        let failed_read = |at: u64, server: usize| Event {
            session: 0,
            process: 0,
            start_us: at,
            end_us: at + 20,
            op: Op::Read {
                kind: ReadKind::Own,
                seen: Some(BTreeMap::new()),
                attempts: vec![refused_connection(server, at), ok(1 - server, at + 10)],
            },
        };
        let down = FaultRecord {
            kind: FaultKind::Kill,
            target: "sqlhttpd-a".to_owned(),
            server: Some(0),
            start_us: 1_000,
            healed_us: 5_000,
            error: None,
        };
        let events = vec![
            failed_read(2_000, 0),                            // down: expected
            failed_read(5_000 + RESTART_GRACE_US - 100, 0),   // within the grace
            failed_read(2_000, 1),                            // the other server: anomaly
            failed_read(5_000 + RESTART_GRACE_US + 1_000, 0), // long after: anomaly
        ];
        let verdict = check(&events, &[down], &BTreeMap::new());
        assert_eq!(verdict.read_errors_during_restarts, 2);
        assert_eq!(
            kinds(&verdict),
            vec![AnomalyKind::ReadFailed, AnomalyKind::ReadFailed]
        );
    }

    #[test]
    fn a_partition_does_not_excuse_a_failed_read() {
        let partition = FaultRecord {
            kind: FaultKind::Partition,
            target: "replica-1".to_owned(),
            server: None,
            start_us: 0,
            healed_us: 1_000_000,
            error: None,
        };
        let events = vec![Event {
            session: 0,
            process: 0,
            start_us: 10,
            end_us: 30,
            op: Op::Read {
                kind: ReadKind::Own,
                seen: None,
                attempts: vec![refused_connection(0, 10)],
            },
        }];
        let verdict = check(&events, &[partition], &BTreeMap::new());
        assert_eq!(kinds(&verdict), vec![AnomalyKind::ReadFailed]);
    }

    #[test]
    fn bookmarks_must_be_sixteen_hex_digits() {
        assert_eq!(parse_bookmark("000000000100002A"), Some(0x0100_002A));
        assert_eq!(parse_bookmark("0/1000028"), None);
        assert_eq!(parse_bookmark("00000000010000280"), None);
        let mut event = write(0, 0, 100, 0, WriteOutcome::Acknowledged);
        if let Op::Write { attempts, .. } = &mut event.op {
            attempts[0].result = AttemptResult::Ok {
                bookmark: Some("0/1000028".to_owned()),
                served_by: None,
                replayed: false,
            };
        }
        let verdict = check(&[event], &[], &table(&[(0, 0, 1)]));
        assert_eq!(kinds(&verdict), vec![AnomalyKind::MalformedBookmark]);
    }

    #[test]
    fn a_refused_write_is_an_anomaly_and_must_not_be_in_the_table() {
        let events = vec![write(0, 0, 100, 0, WriteOutcome::Refused)];
        let verdict = check(&events, &[], &table(&[(0, 0, 1)]));
        let mut got = kinds(&verdict);
        got.sort();
        assert_eq!(
            got,
            vec![AnomalyKind::PhantomRow, AnomalyKind::WriteRefused]
        );
    }
}
