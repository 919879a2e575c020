//! [`WalBound`]: the write-ahead log's two bounds and the gate they make (ADR 0046).
//!
//! - **The truncate threshold** (a quarter of `--max-wal-bytes`, 64 MiB by default): past it the
//!   writer tries a `TRUNCATE` checkpoint every 250 ms (after its jobs, or on the watchdog's
//!   nudge when no write comes), read-only transactions older than a second are ended, and new
//!   read-only transactions wait (at most the statement timeout, then `503`) until the log is
//!   truncated: one opened now would be ended a second later anyway, and its snapshot would
//!   keep the checkpoint from finding the log free (checkpoint starvation).
//! - **The hard bound** (`--max-wal-bytes`, 256 MiB by default): past it writes wait the same way
//!   (the wait is before anything of them runs, so a `503` here never ran), every read-only
//!   transaction is ended whatever its age, and a write transaction is expired: the log grows
//!   only by writes, so it stops growing but for the one write running when it passed.
//!
//! The size is looked at by the watchdog every 100 ms ([`WalBound::look`], which wakes the
//! waiters when it falls) and by the writer's thread right before a write runs
//! ([`WalBound::past_hard`]). Knows the log's file and its size; nothing about SQL, HTTP or
//! the transactions' registry.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::protocol::error::ApiError;

/// The least hard bound taken from `--max-wal-bytes`: its quarter must hold a few writes.
const LEAST_HARD_BOUND: u64 = 4 * 1024 * 1024;

/// Where the log's size stands against its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// At most the truncate threshold.
    Under,
    /// Past the truncate threshold: checkpoints are tried, read-only opens wait.
    PastThreshold,
    /// Past the hard bound: writes wait too, and every transaction that holds the log ends.
    PastHard,
}

impl Level {
    fn from_u8(value: u8) -> Level {
        match value {
            0 => Level::Under,
            1 => Level::PastThreshold,
            _ => Level::PastHard,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Level::Under => 0,
            Level::PastThreshold => 1,
            Level::PastHard => 2,
        }
    }
}

/// The log's file, its bounds, its last seen size and those waiting for it to fall.
#[derive(Debug)]
pub(crate) struct WalBound {
    path: PathBuf,
    threshold: u64,
    hard: u64,
    level: AtomicU8,
    bytes: AtomicU64,
    fell: Notify,
}

impl WalBound {
    /// The bounds for `max_wal_bytes` (`--max-wal-bytes`) of the log at `path`.
    pub(crate) fn new(path: PathBuf, max_wal_bytes: u64) -> WalBound {
        let hard = max_wal_bytes.max(LEAST_HARD_BOUND);
        WalBound {
            path,
            threshold: threshold(max_wal_bytes),
            hard,
            level: AtomicU8::new(Level::Under.to_u8()),
            bytes: AtomicU64::new(0),
            fell: Notify::new(),
        }
    }

    /// The log's size on disk now (0 when there is none).
    fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |meta| meta.len())
    }

    fn level_of(&self, size: u64) -> Level {
        if size > self.hard {
            Level::PastHard
        } else if size > self.threshold {
            Level::PastThreshold
        } else {
            Level::Under
        }
    }

    /// Looks at the log's size now (the watchdog, every 100 ms): records it, and wakes whoever
    /// waits for it to fall when it has.
    pub(crate) fn look(&self) -> Level {
        let size = self.size();
        self.bytes.store(size, Ordering::Release);
        let level = self.level_of(size);
        let before = Level::from_u8(self.level.swap(level.to_u8(), Ordering::AcqRel));
        if level < before {
            self.fell.notify_waiters();
        }
        level
    }

    /// The level seen by the last [`WalBound::look`].
    pub(crate) fn level(&self) -> Level {
        Level::from_u8(self.level.load(Ordering::Acquire))
    }

    /// The size seen by the last [`WalBound::look`], for the metrics.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Whether the log is past its hard bound now (read from the file: the writer's thread,
    /// right before a write runs).
    pub(crate) fn past_hard(&self) -> bool {
        self.size() > self.hard
    }

    /// Waits until the log is below `level` (a write: below [`Level::PastHard`]; a read-only
    /// open: below [`Level::PastThreshold`]), at most `wait`; then `503` with `Retry-After`.
    /// Nothing of the request has run when this refuses it. The size is read now, then
    /// followed through the watchdog's looks.
    pub(crate) async fn below(&self, level: Level, wait: Duration) -> Result<(), ApiError> {
        if self.look() < level {
            return Ok(());
        }
        let waited = tokio::time::timeout(wait, async {
            loop {
                let fell = self.fell.notified();
                tokio::pin!(fell);
                fell.as_mut().enable();
                if self.level() < level {
                    return;
                }
                fell.await;
            }
        })
        .await;
        waited.map_err(|_| self.refusal(level))
    }

    /// The answer for a request refused because the log did not fall below `level` in time.
    pub(crate) fn refusal(&self, level: Level) -> ApiError {
        let mib = |bytes: u64| bytes / (1024 * 1024);
        match level {
            Level::PastHard => ApiError::unavailable(format!(
                "the database's write-ahead log is past its bound ({} MiB) and cannot be \
                 truncated yet (readers still hold it); writes wait until it is: this one was \
                 not run, retry later",
                mib(self.hard)
            )),
            _ => ApiError::unavailable(format!(
                "the database's write-ahead log is past {} MiB and is being truncated; read-only \
                 transactions open once it is: this one was not opened, retry later (a plain \
                 read or a read-only batch runs now)",
                mib(self.threshold)
            )),
        }
    }
}

/// The log's size past which the writer truncates it: a quarter of `--max-wal-bytes`.
pub(crate) fn threshold(max_wal_bytes: u64) -> u64 {
    max_wal_bytes.max(LEAST_HARD_BOUND) / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[tokio::test]
    async fn levels_follow_the_size_and_waiters_wake_when_it_falls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db-wal");
        let bound = std::sync::Arc::new(WalBound::new(path.clone(), 16 * MIB));
        assert_eq!(bound.look(), Level::Under, "no log yet");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(4 * MIB + 1).unwrap();
        assert_eq!(bound.look(), Level::PastThreshold);
        assert_eq!(bound.bytes(), 4 * MIB + 1);
        // A write passes; a read-only open waits, then is refused.
        bound
            .below(Level::PastHard, Duration::from_millis(10))
            .await
            .unwrap();
        let refused = bound
            .below(Level::PastThreshold, Duration::from_millis(10))
            .await
            .unwrap_err();
        assert_eq!(refused.code, crate::protocol::error::ErrorCode::Unavailable);
        file.set_len(16 * MIB + 1).unwrap();
        assert_eq!(bound.look(), Level::PastHard);
        assert!(bound.past_hard());
        let waiting = tokio::spawn({
            let bound = std::sync::Arc::clone(&bound);
            async move { bound.below(Level::PastHard, Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "a write went past the hard bound");
        file.set_len(0).unwrap();
        assert_eq!(bound.look(), Level::Under);
        waiting.await.unwrap().unwrap();
        assert!(!bound.past_hard());
    }

    #[test]
    fn the_threshold_is_a_quarter_of_the_bound_and_the_bound_has_a_floor() {
        assert_eq!(threshold(256 * MIB), 64 * MIB);
        assert_eq!(threshold(0), MIB);
        assert_eq!(WalBound::new(PathBuf::from("x"), 0).hard, 4 * MIB);
    }
}
