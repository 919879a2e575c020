//! What the text checks said of the client texts an engine was sent lately (ADR 0074): an
//! application sends the same few statements again and again, and reading each again cost a
//! verified read about a tenth of the server's instructions. A text is kept once it passed
//! `sandbox::check_text`, with its placeholders rewritten and whether it also passed
//! `sandbox::check_read_only_text`; a text sent again is taken from here, and only the request's
//! own part is checked again (how many parameters it gave: `Rewritten::check_bound`).
//!
//! A text `check_text` refuses is never kept: it is read again each time it comes, and answered
//! as before, in the same order. Both checks are pure functions of the text, so a kept verdict is
//! the one the checks would give again. What is kept is bounded as a whole: no text longer than
//! [`MAX_KEPT_TEXT`] bytes (nor looked up: the lock is not taken for it), at most [`MAX_KEPT`]
//! texts and [`KEPT_BYTES`] bytes counted with each entry's own cost, past which every verdict is
//! forgotten at once (a client sending ever new texts holds nothing more, and pays the checks
//! with a copy of its text).
//!
//! Pure text in, verdicts out: knows the checks and the placeholders' rewriting; nothing about
//! connections, requests or HTTP.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::engine::postgres::placeholders::{self, Rewritten};
use crate::engine::postgres::sandbox;
use crate::protocol::error::ApiError;

/// The longest text kept: longer ones are rare, and their check costs little beside their run.
pub(crate) const MAX_KEPT_TEXT: usize = 4 * 1024;

/// The most texts kept.
pub(crate) const MAX_KEPT: usize = 4096;

/// The most bytes kept: each text as sent and rewritten (its allocation), and
/// [`ENTRY_BYTES`] more for its entry.
pub(crate) const KEPT_BYTES: usize = 1024 * 1024;

/// What an entry costs beside its texts: the map's slot, the `Arc` and the boxes' headers.
const ENTRY_BYTES: usize = 128;

/// The verdicts of one engine's texts (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct CheckedTexts {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    texts: HashMap<Box<str>, Verdict>,
    bytes: usize,
}

/// What the checks said of a kept text, which `check_text` passed.
#[derive(Debug)]
struct Verdict {
    rewritten: Arc<Rewritten>,
    /// `check_read_only_text` passed it too.
    readable: bool,
}

impl CheckedTexts {
    /// Whether `sql` passed every check a read meets before: then a read need not read it again.
    pub(crate) fn passed_for_read(&self, sql: &str) -> bool {
        sql.len() <= MAX_KEPT_TEXT
            && self
                .kept()
                .texts
                .get(sql)
                .is_some_and(|verdict| verdict.readable)
    }

    /// `sql` checked by `sandbox::check_text` and rewritten, from what was kept when it passed
    /// before; a text that passes is kept now.
    pub(crate) fn checked(&self, sql: &str) -> Result<Arc<Rewritten>, ApiError> {
        let keeps = sql.len() <= MAX_KEPT_TEXT;
        if keeps && let Some(verdict) = self.kept().texts.get(sql) {
            return Ok(Arc::clone(&verdict.rewritten));
        }
        sandbox::check_text(sql)?;
        let rewritten = Arc::new(placeholders::rewrite(sql));
        if keeps {
            let readable = sandbox::check_read_only_text(sql).is_ok();
            self.keep(sql, &rewritten, readable);
        }
        Ok(rewritten)
    }

    fn keep(&self, sql: &str, rewritten: &Arc<Rewritten>, readable: bool) {
        let bytes = sql.len() + rewritten.sql.capacity() + ENTRY_BYTES;
        let mut kept = self.kept();
        if kept.texts.contains_key(sql) {
            return;
        }
        let mut forgotten = None;
        if kept.texts.len() >= MAX_KEPT || kept.bytes + bytes > KEPT_BYTES {
            forgotten = Some(std::mem::take(&mut kept.texts));
            kept.bytes = 0;
        }
        let verdict = Verdict {
            rewritten: Arc::clone(rewritten),
            readable,
        };
        kept.texts.insert(sql.into(), verdict);
        kept.bytes += bytes;
        drop(kept);
        // Freed outside the lock.
        drop(forgotten);
    }

    /// How many texts are kept, and their bytes as counted.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let kept = self.kept();
        (kept.texts.len(), kept.bytes)
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        // Nothing is left half-changed under the lock: a panic elsewhere cannot make it wrong.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::ErrorCode;

    #[test]
    fn a_text_that_passed_is_rewritten_once_and_its_parameters_still_counted() {
        let texts = CheckedTexts::default();
        let sql = "SELECT k, v FROM kv WHERE k = ?";
        assert!(!texts.passed_for_read(sql));
        let first = texts.checked(sql).unwrap();
        assert_eq!(first.sql, "SELECT k, v FROM kv WHERE k = $1");
        assert!(texts.passed_for_read(sql));
        let again = texts.checked(sql).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the kept verdict is used");
        assert_eq!(
            texts.held(),
            (1, sql.len() + first.sql.capacity() + ENTRY_BYTES)
        );
        // The request's own part is its caller's to check, every time.
        assert_eq!(again.check_bound(0).unwrap_err().code, ErrorCode::SqlError);
        again.check_bound(1).unwrap();
    }

    #[test]
    fn a_refused_text_is_refused_every_time_and_never_kept() {
        let texts = CheckedTexts::default();
        for _ in 0..2 {
            let err = texts.checked("SET ROLE postgres").unwrap_err();
            assert_eq!(err.code, ErrorCode::StatementNotAllowed);
            assert!(!texts.passed_for_read("SET ROLE postgres"));
        }
        assert_eq!(texts.held(), (0, 0));
        // Allowed to run, but not in a read: kept for writes, so a read checks it again.
        let notify = "SELECT pg_notify('c', 'x')";
        let first = texts.checked(notify).unwrap();
        assert!(!texts.passed_for_read(notify));
        assert!(Arc::ptr_eq(&first, &texts.checked(notify).unwrap()));
        assert_eq!(texts.held().0, 1);
    }

    #[test]
    fn what_is_kept_is_bounded_and_forgotten_at_once_past_the_bound() {
        let texts = CheckedTexts::default();
        let long = format!("SELECT '{}'", "x".repeat(MAX_KEPT_TEXT));
        let first = texts.checked(&long).unwrap();
        assert!(!Arc::ptr_eq(&first, &texts.checked(&long).unwrap()));
        assert!(!texts.passed_for_read(&long), "a long text is not kept");
        assert_eq!(texts.held(), (0, 0));
        let mut kept = 0;
        let mut i = 0;
        // Distinct texts of about 4 KiB each, until the bound is passed and all forgotten.
        loop {
            let sql = format!("SELECT {i}, '{}'", "y".repeat(MAX_KEPT_TEXT / 2 - 20));
            texts.checked(&sql).unwrap();
            let (count, bytes) = texts.held();
            assert!(bytes <= KEPT_BYTES, "{bytes} bytes kept");
            if count <= kept {
                assert_eq!(count, 1, "all forgotten, the new one kept");
                break;
            }
            kept = count;
            i += 1;
        }
        assert!(kept > 100, "{kept} texts were kept before the bound");
    }

    #[test]
    fn no_more_texts_are_kept_than_the_bound_however_short() {
        let texts = CheckedTexts::default();
        for i in 0..=MAX_KEPT * 2 {
            texts.checked(&format!("x{i}")).unwrap();
            let (count, bytes) = texts.held();
            assert!(
                count <= MAX_KEPT && bytes <= KEPT_BYTES,
                "{count} texts, {bytes} bytes"
            );
        }
    }
}
