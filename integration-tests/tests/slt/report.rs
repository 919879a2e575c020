//! The run's summary as text: one line per script and a total (records, run, passed, failed,
//! skipped, time), then the first failures of each script with their line, SQL, and what was
//! expected against what came back.

use std::fmt::Write as _;
use std::time::Duration;

use crate::runner::{Engine, FileReport};

/// How many failures of each script the summary details.
const SHOWN_FAILURES: usize = 5;

/// The SQL of a failure is cut after this many characters.
const SHOWN_SQL: usize = 600;

/// The totals over every script.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    /// Statements and queries run.
    pub(crate) run: usize,
    /// Run and as the scripts expect.
    pub(crate) passed: usize,
    /// Run and not as the scripts expect.
    pub(crate) failed: usize,
    /// Not run (another engine's, or after a `halt`).
    pub(crate) skipped: usize,
    /// Skipped labeled queries the scripts contradict themselves on.
    pub(crate) label_conflicts: usize,
    /// Failed drops of the scripts' objects.
    pub(crate) cleanup_errors: usize,
    /// Wall time of all scripts.
    pub(crate) elapsed: Duration,
}

impl Totals {
    /// Adds up `reports`.
    pub(crate) fn of(reports: &[FileReport]) -> Totals {
        reports.iter().fold(Totals::default(), |t, r| Totals {
            run: t.run + r.run,
            passed: t.passed + r.passed,
            failed: t.failed + r.failed,
            skipped: t.skipped + r.skipped,
            label_conflicts: t.label_conflicts + r.label_conflicts,
            cleanup_errors: t.cleanup_errors + r.cleanup_errors.len(),
            elapsed: t.elapsed + r.elapsed,
        })
    }

    /// Passed over run, 0 to 1 (1 when nothing ran).
    pub(crate) fn pass_rate(&self) -> f64 {
        if self.run == 0 {
            1.0
        } else {
            self.passed as f64 / self.run as f64
        }
    }
}

/// The summary: a table of counts per script and in total, then failure details.
pub(crate) fn summary(engine: Engine, server: &str, reports: &[FileReport]) -> String {
    let totals = Totals::of(reports);
    let mut out = String::new();
    let _ = writeln!(out, "sqllogictest on {} ({server})", engine.name());
    let _ = writeln!(
        out,
        "{:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "file", "records", "run", "passed", "failed", "skipped", "time"
    );
    let line = |out: &mut String, name: &str, r: Totals| {
        let _ = writeln!(
            out,
            "{:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.1}s",
            name,
            r.run + r.skipped,
            r.run,
            r.passed,
            r.failed,
            r.skipped,
            r.elapsed.as_secs_f64()
        );
    };
    for report in reports {
        line(
            &mut out,
            &report.file,
            Totals::of(std::slice::from_ref(report)),
        );
    }
    line(&mut out, "total", totals);
    let _ = writeln!(
        out,
        "pass rate {:.2}% of the records run",
        totals.pass_rate() * 100.0
    );

    for report in reports {
        if let Some(line) = report.halted_at {
            let _ = writeln!(out, "{}: halted at line {line}", report.file);
        }
        if report.label_conflicts > 0 {
            let _ = writeln!(
                out,
                "{}: {} skipped labeled queries contradict their label",
                report.file, report.label_conflicts
            );
        }
        for error in &report.cleanup_errors {
            let _ = writeln!(out, "{}: clean-up failed: {error}", report.file);
        }
        if report.failures.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "\n{}: first {} of {} failures",
            report.file,
            report.failures.len().min(SHOWN_FAILURES),
            report.failed + report.label_conflicts
        );
        for failure in report.failures.iter().take(SHOWN_FAILURES) {
            let mut sql: String = failure.sql.chars().take(SHOWN_SQL).collect();
            if sql.len() < failure.sql.len() {
                sql.push_str(" ...");
            }
            let _ = writeln!(
                out,
                "  {}:{}\n    sql:      {}\n    expected: {}\n    got:      {}",
                failure.file,
                failure.line,
                sql.replace('\n', "\n              "),
                failure.expected,
                failure.got
            );
        }
    }
    out
}
