//! The figures of a run (operations, faults by kind, history size, anomalies, read latency) and
//! the summary printed at its end. It must not judge the history: the checker's verdict is
//! given to it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::history::{AttemptResult, FaultKind, Op, WriteOutcome};
use crate::{Outcome, RunConfig};

/// A read this slow is counted apart (a replica frozen while it served the read holds it).
const SLOW_READ_US: u64 = 1_000_000;

/// Counts and latencies of a run.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    pub(crate) acknowledged: usize,
    pub(crate) unknown: usize,
    pub(crate) refused: usize,
    pub(crate) replayed: usize,
    pub(crate) reads_ok: usize,
    pub(crate) reads_failed: usize,
    pub(crate) hand_overs: usize,
    pub(crate) attempts: usize,
    /// Successful read attempts by their `Sqlhttp-Served-By` (`-` when absent).
    pub(crate) served_by: BTreeMap<String, Vec<u64>>,
    /// Answers that carried a bookmark.
    pub(crate) bookmarked: usize,
}

impl Figures {
    /// The figures of `outcome`'s history.
    pub(crate) fn of(outcome: &Outcome) -> Figures {
        let mut figures = Figures::default();
        for event in &outcome.events {
            match &event.op {
                Op::Write {
                    outcome, attempts, ..
                } => {
                    match outcome {
                        WriteOutcome::Acknowledged => figures.acknowledged += 1,
                        WriteOutcome::Unknown => figures.unknown += 1,
                        WriteOutcome::Refused => figures.refused += 1,
                    }
                    figures.attempts += attempts.len();
                    for attempt in attempts {
                        if let AttemptResult::Ok {
                            replayed, bookmark, ..
                        } = &attempt.result
                        {
                            figures.replayed += usize::from(*replayed);
                            figures.bookmarked += usize::from(bookmark.is_some());
                        }
                    }
                }
                Op::Read { seen, attempts, .. } => {
                    if seen.is_some() {
                        figures.reads_ok += 1;
                    } else {
                        figures.reads_failed += 1;
                    }
                    figures.attempts += attempts.len();
                    for attempt in attempts {
                        if let AttemptResult::Ok {
                            served_by,
                            bookmark,
                            ..
                        } = &attempt.result
                        {
                            figures.bookmarked += usize::from(bookmark.is_some());
                            figures
                                .served_by
                                .entry(served_by.clone().unwrap_or_else(|| "-".to_owned()))
                                .or_default()
                                .push(attempt.end_us - attempt.start_us);
                        }
                    }
                }
                Op::HandOver { .. } => figures.hand_overs += 1,
            }
        }
        figures
    }

    /// Every successful read attempt's latency, in microseconds.
    fn read_latencies(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.served_by.values().flatten().copied().collect();
        all.sort_unstable();
        all
    }
}

/// The `p`-th percentile (0-100) of sorted `values`, in milliseconds.
fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64)).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn latency_line(values: &[u64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} reads)",
        percentile_ms(&sorted, 50.0),
        percentile_ms(&sorted, 99.0),
        percentile_ms(&sorted, 100.0),
        sorted.len()
    )
}

/// The summary of a run, as `scripts/consistency-check` prints it.
pub(crate) fn summary(config: &RunConfig, outcome: &Outcome) -> String {
    let figures = Figures::of(outcome);
    let verdict = &outcome.verdict;
    let mut out = String::new();
    let _ = writeln!(out, "== consistency check");
    let _ = writeln!(
        out,
        "run: {} s, {} sessions, {} sqlhttpd, {} replica containers, seed {}{}",
        config.seconds,
        config.sessions,
        config.topology.servers.len(),
        config.topology.replicas.len(),
        config.seed,
        if config.send_bookmarks {
            ""
        } else {
            ", NO bookmarks sent"
        }
    );
    let writes = figures.acknowledged + figures.unknown + figures.refused;
    let reads = figures.reads_ok + figures.reads_failed;
    let _ = writeln!(
        out,
        "operations: {} ({writes} writes: {} acknowledged ({} by a replay), {} unknown, {} refused; \
         {reads} reads: {} answered, {} failed; {} hand-overs, {} reads by a new process before its first write)",
        writes + reads + figures.hand_overs,
        figures.acknowledged,
        figures.replayed,
        figures.unknown,
        figures.refused,
        figures.reads_ok,
        figures.reads_failed,
        figures.hand_overs,
        verdict.reads_after_hand_over,
    );
    let tx = &outcome.transactions;
    let _ = writeln!(
        out,
        "transactional writes (each COMMIT's first answer dropped by a proxy): {} ({} committed, \
         {} runs lost before committing and run again); {} COMMIT answers dropped, {} COMMITs \
         sent again, {} answered committed without a bookmark",
        tx.writes,
        tx.committed,
        tx.runs_lost,
        tx.commits_dropped,
        tx.commits_resent,
        tx.replays_without_bookmark,
    );
    for last in &tx.unknown_commits {
        let _ = writeln!(
            out,
            "  a COMMIT whose outcome stayed unknown was last answered: {last}"
        );
    }
    let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
    for fault in &outcome.faults {
        *by_kind.entry(fault.kind).or_default() += 1;
    }
    let kinds: Vec<String> = FaultKind::ALL
        .iter()
        .map(|kind| {
            format!(
                "{} {}",
                by_kind.get(kind).copied().unwrap_or(0),
                kind.name()
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "faults: {} injected: {}",
        outcome.faults.len(),
        kinds.join(", ")
    );
    for fault in outcome.faults.iter().filter(|f| f.error.is_some()) {
        let _ = writeln!(
            out,
            "  fault error at +{:.3}s on {}: {}",
            fault.start_us as f64 / 1e6,
            fault.target,
            fault.error.as_deref().unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "history: {} events ({} HTTP attempts, {} faults); final table: {} rows; {} answers carried a bookmark",
        outcome.events.len() + outcome.faults.len(),
        figures.attempts,
        outcome.faults.len(),
        outcome.table_rows,
        figures.bookmarked,
    );
    let _ = writeln!(
        out,
        "errors while an sqlhttpd was down (expected, retried on the other): {} read attempts, {} write attempts; \
         write attempts failed while their sqlhttpd was up (retried): {}",
        verdict.read_errors_during_restarts,
        verdict.write_errors_during_restarts,
        verdict.write_errors_outside_restarts,
    );
    let _ = writeln!(
        out,
        "read latency: {}",
        latency_line(&figures.read_latencies())
    );
    let slow = figures
        .read_latencies()
        .iter()
        .filter(|&&us| us >= SLOW_READ_US)
        .count();
    let _ = writeln!(
        out,
        "  reads that took {} s or more: {slow}",
        SLOW_READ_US / 1_000_000
    );
    for (served_by, latencies) in &figures.served_by {
        let _ = writeln!(out, "  served by {served_by}: {}", latency_line(latencies));
    }
    let mut anomalies: BTreeMap<&str, usize> = BTreeMap::new();
    for anomaly in &verdict.anomalies {
        *anomalies.entry(anomaly.kind.name()).or_default() += 1;
    }
    let _ = writeln!(out, "anomalies: {}", verdict.anomalies.len());
    for (kind, count) in anomalies {
        let _ = writeln!(out, "  {count} {kind}");
    }
    for anomaly in verdict.anomalies.iter().take(20) {
        let _ = writeln!(
            out,
            "  at +{:.3}s, session {}: {}: {}",
            anomaly.at_us as f64 / 1e6,
            anomaly
                .session
                .map_or_else(|| "-".to_owned(), |s| s.to_string()),
            anomaly.kind.name(),
            anomaly.detail
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::percentile_ms;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let values: Vec<u64> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(percentile_ms(&values, 50.0), 50.0);
        assert_eq!(percentile_ms(&values, 99.0), 99.0);
        assert_eq!(percentile_ms(&values, 100.0), 100.0);
        assert_eq!(percentile_ms(&[7000], 99.0), 7.0);
        assert_eq!(percentile_ms(&[], 50.0), 0.0);
    }
}
