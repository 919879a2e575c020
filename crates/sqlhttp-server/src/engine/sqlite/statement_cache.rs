//! [`StatementCache`]: which client statements one SQLite connection keeps compiled between
//! requests (ADR 0071). A point read's compile under the sandbox's authorizer was an eighth of
//! the instructions a read cost (ADR 0057); a statement kept compiled skips it.
//!
//! A text is kept only once a compile under the sandbox has shown it to be one statement that
//! cannot write, reads no column named `rank` and runs no `PRAGMA` (`sandbox::may_be_kept`):
//! such a statement needs none of what the authorizer records for the statement after it
//! compiled (whether it changes a schema, which tables it inserts into, whether its plan must
//! be checked for a `rank` constraint), and its answer is computed when it runs, not when it
//! compiles; so a cached copy, which the authorizer does not see again, meets exactly the rules
//! a fresh compile would. Whatever it depends on beyond its text is the schema: every kept
//! statement is dropped when the connection sees the schema move ([`StatementCache::forget`],
//! called by `Conn::refresh_schema`, which does not take a version read inside the writer's
//! transaction for the database's), so the next compile is under the new schema and the
//! authorizer again.
//!
//! A text is kept under the exact text SQLite compiled: rusqlite's cache trims a text with
//! Rust's `str::trim`, which strips Unicode whitespace that SQLite reads as part of a name
//! (`v\u{a0}` is another table than `v`), so a text whose ends hold any is never kept nor looked
//! up ([`key`]): otherwise its trimmed twin, never checked, would run in its place.
//!
//! Bounded: at most [`KEPT`] texts of at most [`LONGEST_KEPT`] bytes each per connection, each
//! compiled to at most [`LARGEST_KEPT`] bytes of SQLite's memory (a short text over nested
//! views compiles to a large program); when a new text would pass the count, all of them are
//! dropped and the cache starts again (a workload of one-off texts costs a flush every
//! [`KEPT`] texts, never memory).
//!
//! The compiled statements themselves live in rusqlite's cache of the connection
//! (`Connection::prepare_cached`), which also holds the engine's own statements; it is sized
//! here so that the clients' never push those out. Knows nothing of requests or HTTP.

use std::cell::RefCell;
use std::collections::HashSet;

use rusqlite::{Connection, Statement, StatementStatus};

/// How many client statements one connection keeps compiled.
pub(crate) const KEPT: usize = 32;

/// The longest text (in bytes, trimmed) a connection keeps compiled: a point read is short, and
/// a long text's program is large.
pub(crate) const LONGEST_KEPT: usize = 4096;

/// The most memory (bytes, as SQLite counts a compiled statement's) a kept statement may hold:
/// a point read's program takes a few kilobytes.
pub(crate) const LARGEST_KEPT: i32 = 64 * 1024;

/// Room in rusqlite's cache for the engine's own statements (the schema check, savepoints, the
/// rowid probe's reset, keyed writes' store, the sandbox's look-ups): about a dozen.
const ENGINE_STATEMENTS: usize = 24;

/// The client statement texts a connection keeps compiled.
#[derive(Debug, Default)]
pub(crate) struct StatementCache {
    texts: RefCell<HashSet<Box<str>>>,
}

impl StatementCache {
    /// Sizes `conn`'s statement cache for the engine's statements and [`KEPT`] clients'.
    pub(crate) fn size(conn: &Connection) {
        conn.set_prepared_statement_cache_capacity(ENGINE_STATEMENTS + KEPT);
    }

    /// Whether `sql` is kept compiled: [`Connection::prepare_cached`] then finds it (or, if
    /// rusqlite let it go, compiles it again, under the sandbox as any client statement).
    pub(crate) fn holds(&self, sql: &str) -> bool {
        key(sql).is_some_and(|key| self.texts.borrow().contains(key))
    }

    /// Keeps `sql`, compiled as `compiled`, from its next run on. Call it only for a text whose
    /// compile under the sandbox showed it is one statement that cannot write and
    /// `sandbox::may_be_kept`.
    pub(crate) fn keep(&self, conn: &Connection, sql: &str, compiled: &Statement<'_>) {
        let Some(sql) = key(sql) else { return };
        if sql.len() > LONGEST_KEPT || compiled.get_status(StatementStatus::MemUsed) > LARGEST_KEPT
        {
            return;
        }
        if self.texts.borrow().len() >= KEPT {
            self.forget(conn);
        }
        self.texts.borrow_mut().insert(sql.into());
    }

    /// Drops every kept statement (the schema moved, or the cache is full). The engine's own
    /// statements go too, and are compiled again when next used.
    pub(crate) fn forget(&self, conn: &Connection) {
        self.texts.borrow_mut().clear();
        conn.flush_prepared_statement_cache();
    }
}

/// The text rusqlite's cache compiles and finds `sql` under (`str::trim`'s), when that is the
/// statement SQLite would read in `sql`: the trim removed only what SQLite skips as whitespace
/// (space, tab, line feed, form feed, carriage return). `None` for a text whose ends hold other
/// Unicode whitespace, which SQLite reads as part of a name.
fn key(sql: &str) -> Option<&str> {
    let sqlite_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0c' | '\r');
    let trimmed = sql.trim_matches(sqlite_space);
    (trimmed.len() == sql.trim().len()).then_some(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_is_kept_under_what_sqlite_reads_in_it() {
        assert_eq!(key(" \n\tSELECT 1\r\n"), Some("SELECT 1"));
        assert_eq!(key("SELECT 1"), Some("SELECT 1"));
        // SQLite reads a no-break space, a line separator or an ideographic space as part of
        // a name: `v\u{a0}` is not `v`.
        for text in [
            "SELECT * FROM v\u{a0}",
            "\u{2028}SELECT 1",
            "SELECT 1 \u{3000}",
        ] {
            assert_eq!(key(text), None, "{text:?}");
        }
    }
}
