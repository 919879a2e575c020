//! Progress on stderr, only when stderr is a terminal: a line with rows and rows per second, and
//! a bar of bytes read when the input's size is known (an import from a file).
//!
//! Knows indicatif; nothing about what is being counted.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress line, or nothing when stderr is not a terminal.
#[derive(Debug)]
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A spinner line for `what` ("exported", "imported").
    pub(crate) fn new(what: &'static str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(&format!("{{spinner}} {what} {{msg}}"))
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress { bar: Some(bar) }
    }

    /// A bar for `what` over `total` bytes of input, with rows and rows per second.
    pub(crate) fn bytes(what: &'static str, total: u64) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "{what} [{{bar:30}}] {{bytes}}/{{total_bytes}} {{msg}}"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Progress { bar: Some(bar) }
    }

    /// Reports the bytes of input read so far (a bar only).
    pub(crate) fn read(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
        }
    }

    /// Reports `rows` done after `elapsed`.
    pub(crate) fn rows(&self, rows: u64, elapsed: Duration) {
        if let Some(bar) = &self.bar {
            let rate = rows as f64 / elapsed.as_secs_f64().max(1e-3);
            bar.set_message(format!("{rows} rows ({rate:.0} rows/s)"));
        }
    }

    /// Removes the line.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
