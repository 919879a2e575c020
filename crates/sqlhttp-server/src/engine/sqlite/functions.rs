//! SQLite built-ins whose single call could outlast the statement timeout, replaced on every
//! connection by implementations with the same results that are linear in their input or look
//! at the job's clock while they work.
//!
//! The progress handler (see `connection`) runs between virtual-machine steps, and one call of a
//! built-in function is one step. SQLite's `instr` and `replace` compare the needle at every
//! position (`instr(zeroblob(2*N), zeroblob(N)||x'01')` is N² byte compares: 25 s for 1 MB),
//! `trim`, `ltrim` and `rtrim` compare every input character with every character of the set,
//! `unhex(x, pass)` scans the pass set for every skipped character, and `LIKE`/`GLOB` retry
//! a pattern segment at every input position (string length × pattern length). None of them
//! returns to the virtual machine in between, so neither the timeout, a client that left nor a
//! shutdown could stop them. Here `instr` and `replace` search with `memchr::memmem` (linear),
//! the `trim` family and `unhex` look characters up in tables, and `like`/`glob` keep SQLite's
//! algorithm (ported line by line) while asking [`Hooks::must_stop`] every so often; a stopped
//! call fails with `SQLITE_INTERRUPT`, which the engine reports as the progress handler's stop
//! (`422 STATEMENT_TIMEOUT`, or `503` for a cancelled request or a closing server).
//!
//! Semantics are SQLite's own, byte for byte: arguments are read as `sqlite3_value_text` reads
//! them (integers and reals in SQLite's text form, blobs as their bytes, text up to its first
//! NUL where SQLite's code stops there), invalid UTF-8 is decoded as `sqlite3Utf8Read` does, and
//! errors carry SQLite's codes and messages. The differential property tests below compare each
//! replacement with the built-in on a plain connection. See
//! `docs/adr/0024-bounded-built-ins.md`.
//!
//! The families live in submodules: `search` (`instr`, `replace`), `trim` (`trim`, `ltrim`,
//! `rtrim`), `unhex`, `pattern` (`like`, `glob`) and `json_patch` (`json_patch`,
//! `jsonb_patch`), over the UTF-8 reading of SQLite's C code in `utf8`. This file holds their
//! registration and what they share: the clock's [`Budget`], SQLite's errors and argument text.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use rusqlite::functions::FunctionFlags;
use rusqlite::limits::Limit;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql, ffi};

use crate::engine::sqlite::control::Hooks;

mod json_patch;
mod pattern;
mod search;
#[cfg(test)]
mod tests;
mod trim;
mod unhex;
mod utf8;

use pattern::{GLOB, LIKE, like};
use search::{instr, replace};
use trim::{Sides, trim};
use unhex::unhex;

/// Units of work (about a byte compared or a character read each) between two looks at the
/// job's clock: well under a millisecond of work.
const CHECK_EVERY: u64 = 1 << 18;

/// Registers the replacements on `conn`. Call it after the connection's limits are set: the
/// value-length and LIKE-pattern limits are read here.
///
/// A database stored in UTF-16 keeps SQLite's built-ins: there, a blob read as text is decoded
/// from UTF-16, which these replacements (reading blobs as UTF-8 bytes) would not match.
pub(crate) fn register(conn: &Connection, hooks: &Arc<Hooks>) -> rusqlite::Result<()> {
    let encoding: String = conn.pragma_query_value(None, "encoding", |row| row.get(0))?;
    if !encoding.eq_ignore_ascii_case("UTF-8") {
        tracing::warn!(
            %encoding,
            "the database is not UTF-8: SQLite's own instr, replace, trim, unhex, like and glob \
             stay in place, and one call of them is not bounded by the statement timeout"
        );
        return Ok(());
    }
    let max_length = usize::try_from(conn.limit(Limit::SQLITE_LIMIT_LENGTH)?).unwrap_or(0);
    let pattern_limit =
        usize::try_from(conn.limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH)?).unwrap_or(0);
    let flags = FunctionFlags::SQLITE_UTF8
        | FunctionFlags::SQLITE_DETERMINISTIC
        | FunctionFlags::SQLITE_INNOCUOUS;

    conn.create_scalar_function("instr", 2, flags, |ctx| instr(ctx))?;
    conn.create_scalar_function("replace", 3, flags, move |ctx| replace(ctx, max_length))?;
    for (name, sides) in [
        ("ltrim", Sides::LEFT),
        ("rtrim", Sides::RIGHT),
        ("trim", Sides::BOTH),
    ] {
        for args in [1, 2] {
            let hooks = Arc::clone(hooks);
            conn.create_scalar_function(name, args, flags, move |ctx| {
                trim(ctx, sides, max_length, &hooks)
            })?;
        }
    }
    conn.create_scalar_function("unhex", 2, flags, move |ctx| unhex(ctx, max_length))?;
    for (name, args, info) in [("like", 2, LIKE), ("like", 3, LIKE), ("glob", 2, GLOB)] {
        let hooks = Arc::clone(hooks);
        conn.create_scalar_function(name, args, flags, move |ctx| {
            like(ctx, info, pattern_limit, &hooks)
        })?;
    }
    for (name, output) in [
        ("json_patch", json_patch::Output::Text),
        ("jsonb_patch", json_patch::Output::Jsonb),
    ] {
        let hooks = Arc::clone(hooks);
        conn.create_scalar_function(
            name,
            2,
            flags | FunctionFlags::SQLITE_RESULT_SUBTYPE,
            move |ctx| json_patch::json_patch(ctx, output, max_length, &hooks),
        )?;
    }
    Ok(())
}

/// A function's periodic look at the job's clock.
struct Budget<'a> {
    hooks: &'a Hooks,
    left: u64,
}

impl<'a> Budget<'a> {
    fn new(hooks: &'a Hooks) -> Budget<'a> {
        Budget {
            hooks,
            left: CHECK_EVERY,
        }
    }

    /// Counts `units` of work; fails with `SQLITE_INTERRUPT` once the job must stop.
    #[inline]
    fn spend(&mut self, units: usize) -> rusqlite::Result<()> {
        let units = u64::try_from(units).unwrap_or(u64::MAX);
        if units < self.left {
            self.left -= units;
            return Ok(());
        }
        self.look()
    }

    #[cold]
    fn look(&mut self) -> rusqlite::Result<()> {
        self.left = CHECK_EVERY;
        if self.hooks.must_stop() {
            Err(failure(ffi::SQLITE_INTERRUPT, None))
        } else {
            Ok(())
        }
    }
}

/// An error with SQLite's code; without a message SQLite supplies its own for the code
/// ("interrupted", "string or blob too big"), as its built-ins do.
fn failure(code: i32, message: Option<&str>) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(ffi::Error::new(code), message.map(str::to_owned))
}

/// A text result made of any bytes (SQLite text need not be valid UTF-8).
struct RawText(Vec<u8>);

impl ToSql for RawText {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(&self.0)))
    }
}

thread_local! {
    /// A private connection that renders reals in SQLite's own text form.
    static RENDERER: RefCell<Option<Connection>> = const { RefCell::new(None) };
}

/// Runs `work` on the engine thread's private plain connection (SQLite's own built-ins, no
/// limits but SQLite's), opened on first use.
fn with_renderer<T>(work: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    RENDERER.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            *slot = Some(Connection::open_in_memory()?);
        }
        let Some(conn) = slot.as_ref() else {
            return Err(rusqlite::Error::InvalidQuery);
        };
        work(conn)
    })
}

/// SQLite's text for a real (`%!.17g`), from SQLite itself.
fn real_text(value: f64) -> rusqlite::Result<Vec<u8>> {
    with_renderer(|conn| {
        let text: Option<String> = conn
            .prepare_cached("SELECT CAST(?1 AS TEXT)")?
            .query_row([value], |row| row.get(0))?;
        Ok(text.unwrap_or_default().into_bytes())
    })
}

/// An argument as `sqlite3_value_text` gives it, with all its bytes (`sqlite3_value_bytes`);
/// `None` for NULL.
fn text_of(value: ValueRef<'_>) -> rusqlite::Result<Option<Cow<'_, [u8]>>> {
    Ok(match value {
        ValueRef::Null => None,
        ValueRef::Integer(i) => Some(Cow::Owned(i.to_string().into_bytes())),
        ValueRef::Real(r) => Some(Cow::Owned(real_text(r)?)),
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => Some(Cow::Borrowed(bytes)),
    })
}
