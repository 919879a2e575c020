//! Bookmarks past the primary's log (`409 BOOKMARK_AHEAD`, issue 35): [`PrimaryLog`], the
//! furthest position of the primary's log this process has seen, and [`PrimaryLog::check`],
//! which refuses a request whose bookmark is past everything the primary has written.
//!
//! Such a bookmark (from another cluster, a misrouted answer, a failover to a primary whose log
//! is behind) could never be satisfied by a replica: every read carrying it would wait
//! `--replica-wait` and go to the primary, for as long as its client kept it. Refused, the
//! client drops it (the SDK does, and retries).
//!
//! The check costs an atomic load on the hot path. What has been seen comes from the replica
//! watchers' samples of the primary (`pg_current_wal_lsn()`), from every position this
//! process's requests read on the primary (a commit's, a read's snapshot's: see `lease`), and
//! from the primary asked here. Only a bookmark past all of them asks the primary for its
//! insert position now (`pg_current_wal_insert_lsn()`, at or past every bookmark it ever handed
//! out, since the log only grows): a bookmark another process just handed out is then served,
//! never refused. Asks are one at a time on one connection of their own, and a request that
//! waited behind an ask that answered far enough does not ask again.
//!
//! Knows how to ask the primary for its position; nothing about HTTP or what requests run.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::engine::postgres::{replicas, wire};
use crate::protocol::bookmark::{Bookmark, ReadAt};
use crate::protocol::error::{ApiError, ErrorCode};

/// After an ask that got no answer (the primary is down or slow), bookmarks past what was seen
/// are let through unasked for this long: requests then go on as if there were no check (the
/// primary, which always satisfies a bookmark, would fail or serve them anyway), rather than
/// each waiting for an answer that does not come.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// The primary's insert position now: at or past every commit and snapshot position it named.
const INSERT_POSITION: &str = "SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text";

/// How far the primary's log is known to reach, and how to ask it (see the module's doc).
pub(super) struct PrimaryLog {
    /// The furthest position seen: a position the primary's log has reached, so never past
    /// where it is now.
    seen: AtomicU64,
    /// The connection that asks (opened on first use), held while asking.
    asking: tokio::sync::Mutex<Asking>,
    /// How to log in to ask (the `--database` URL's role, as the replica watchers do).
    target: wire::Target,
}

#[derive(Default)]
struct Asking {
    client: Option<Client>,
    /// When an ask last got no answer.
    failed_at: Option<Instant>,
}

/// One ask of the primary's position, on the connection it is given (`None`: no answer).
type Ask<'a> = Pin<Box<dyn Future<Output = Option<u64>> + Send + 'a>>;

impl PrimaryLog {
    pub(super) fn new(target: wire::Target) -> PrimaryLog {
        PrimaryLog {
            seen: AtomicU64::new(0),
            asking: tokio::sync::Mutex::new(Asking::default()),
            target,
        }
    }

    /// Keeps `position`, read on the primary (or of it), when it is further than what was seen.
    pub(super) fn saw(&self, position: u64) {
        self.seen.fetch_max(position, Ordering::AcqRel);
    }

    /// `409 BOOKMARK_AHEAD` when `at`'s bookmark is past everything the primary has written;
    /// nothing runs before this answers.
    pub(super) async fn check(&self, at: ReadAt) -> Result<(), ApiError> {
        let Some(bookmark) = at.min else {
            return Ok(());
        };
        if !ahead(bookmark, self.seen.load(Ordering::Acquire)) {
            return Ok(());
        }
        // A clone of the target (only when asking): the ask borrows the connection alone.
        let target = self.target.clone();
        self.check_with(bookmark, move |client| {
            Box::pin(async move { replicas::ask(client, &target, INSERT_POSITION).await })
        })
        .await
    }

    /// [`PrimaryLog::check`] of `bookmark`, asking the primary with `ask` when needed.
    async fn check_with<F>(&self, bookmark: Bookmark, ask: F) -> Result<(), ApiError>
    where
        F: for<'a> FnOnce(&'a mut Option<Client>) -> Ask<'a>,
    {
        if !ahead(bookmark, self.seen.load(Ordering::Acquire)) {
            return Ok(());
        }
        let mut asking = self.asking.lock().await;
        // An ask made while this waited answered after this request arrived: when it reached
        // the bookmark, the bookmark is not ahead.
        if !ahead(bookmark, self.seen.load(Ordering::Acquire)) {
            return Ok(());
        }
        if asking
            .failed_at
            .is_some_and(|failed| failed.elapsed() < ASK_AGAIN_AFTER)
        {
            return Ok(());
        }
        let Some(now) = ask(&mut asking.client).await else {
            asking.failed_at = Some(Instant::now());
            tracing::warn!(
                "cannot ask the primary for its log position: a bookmark past what this server \
                 has seen is let through unchecked"
            );
            return Ok(());
        };
        asking.failed_at = None;
        self.saw(now);
        if ahead(bookmark, now) {
            return Err(refused(bookmark, now));
        }
        Ok(())
    }
}

impl std::fmt::Debug for PrimaryLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrimaryLog")
            .field(
                "seen",
                &Bookmark::from_position(self.seen.load(Ordering::Relaxed)),
            )
            .finish_non_exhaustive()
    }
}

/// Whether `bookmark` is past `position`, a position the primary's log has reached.
fn ahead(bookmark: Bookmark, position: u64) -> bool {
    bookmark.position() > position
}

/// The answer for a bookmark past the primary's log, which is at `position`.
fn refused(bookmark: Bookmark, position: u64) -> ApiError {
    ApiError::new(
        ErrorCode::BookmarkAhead,
        format!(
            "the request's bookmark {bookmark} is past this database's log (at {}): it comes \
             from another database, or from before a failover. Nothing ran: drop the bookmark \
             and send the request again without it (the sqlhttp SDK does so and retries)",
            Bookmark::from_position(position)
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn log() -> PrimaryLog {
        PrimaryLog::new(wire::Target {
            config: tokio_postgres::Config::new(),
            tls: std::sync::Arc::new(
                crate::engine::postgres::tls::PgTls::new(&crate::config::PgSsl {
                    mode: crate::config::SslMode::Disable,
                    root_cert: None,
                })
                .unwrap(),
            ),
        })
    }

    /// Checks `bookmark`, the primary answering `answer` when asked; counts the asks.
    async fn check(
        log: &PrimaryLog,
        bookmark: u64,
        answer: Option<u64>,
        asks: &AtomicUsize,
    ) -> Result<(), ApiError> {
        log.check_with(Bookmark::from_position(bookmark), |_| {
            asks.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move { answer })
        })
        .await
    }

    #[test]
    fn a_bookmark_is_ahead_only_past_the_position() {
        assert!(!ahead(Bookmark::from_position(0), 0));
        assert!(!ahead(Bookmark::from_position(41), 42));
        assert!(!ahead(Bookmark::from_position(42), 42));
        assert!(ahead(Bookmark::from_position(43), 42));
        assert!(ahead(Bookmark::from_position(u64::MAX), u64::MAX - 1));
    }

    #[tokio::test]
    async fn a_bookmark_within_what_was_seen_is_served_without_asking() {
        let log = log();
        let asks = AtomicUsize::new(0);
        log.saw(100);
        log.saw(50);
        for bookmark in [0, 1, 99, 100] {
            check(&log, bookmark, None, &asks).await.unwrap();
        }
        assert!(log.check(ReadAt::default()).await.is_ok());
        assert_eq!(asks.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_bookmark_past_what_was_seen_asks_once_and_is_served_when_the_primary_has_it() {
        let log = log();
        let asks = AtomicUsize::new(0);
        log.saw(100);
        // Handed out by a commit after the last sample: the primary, asked, is past it.
        check(&log, 150, Some(160), &asks).await.unwrap();
        assert_eq!(asks.load(Ordering::Relaxed), 1);
        // What the ask answered is seen now.
        check(&log, 160, Some(0), &asks).await.unwrap();
        assert_eq!(asks.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_bookmark_past_the_primary_is_refused_as_ahead() {
        let log = log();
        let asks = AtomicUsize::new(0);
        log.saw(100);
        let err = check(&log, 0x1_0000_0000, Some(0x200), &asks)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::BookmarkAhead);
        assert_eq!(err.code.status(), 409);
        assert!(err.message.contains("0000000100000000"), "{}", err.message);
        assert!(err.message.contains("0000000000000200"), "{}", err.message);
        // Asked again each time: the primary may have moved on.
        assert!(
            check(&log, 0x1_0000_0000, Some(0x300), &asks)
                .await
                .is_err()
        );
        assert_eq!(asks.load(Ordering::Relaxed), 2);
        check(&log, 0x300, None, &asks).await.unwrap();
        assert_eq!(asks.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_primary_that_does_not_answer_lets_bookmarks_through_without_asking_for_a_while() {
        let log = log();
        let asks = AtomicUsize::new(0);
        check(&log, 500, None, &asks).await.unwrap();
        check(&log, u64::MAX, Some(0), &asks).await.unwrap();
        assert_eq!(asks.load(Ordering::Relaxed), 1);
    }
}
