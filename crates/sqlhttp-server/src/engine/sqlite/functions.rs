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

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use memchr::memmem;
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::limits::Limit;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql, ffi};

use crate::engine::sqlite::control::Hooks;

mod json_patch;

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

/// The part of `bytes` that SQLite's NUL-terminated string code sees.
fn up_to_nul(bytes: &[u8]) -> &[u8] {
    match memchr::memchr(0, bytes) {
        Some(end) => &bytes[..end],
        None => bytes,
    }
}

fn is_continuation(byte: u8) -> bool {
    byte & 0xc0 == 0x80
}

/// The byte at `at`, or the terminating NUL past the end.
#[inline]
fn byte_at(bytes: &[u8], at: usize) -> u8 {
    bytes.get(at).copied().unwrap_or(0)
}

/// `sqlite3Utf8Trans1`: the payload bits of a lead byte 0xc0..=0xff.
const UTF8_TRANS1: [u8; 64] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x00, 0x01, 0x02, 0x03, 0x00, 0x01, 0x00, 0x00,
];

/// `sqlite3Utf8Read` over a NUL-terminated string: the character at `*at` (a lead byte takes
/// every continuation byte after it; overlong forms and surrogates read as U+FFFD; a stray
/// continuation byte is a character of its own), moving `*at` past it. At the end it reads the
/// terminating 0 and moves one past it, as SQLite's pointer does.
#[inline]
fn utf8_read(bytes: &[u8], at: &mut usize) -> u32 {
    let mut c = u32::from(byte_at(bytes, *at));
    *at += 1;
    if c >= 0xc0 {
        c = utf8_rest(bytes, at, c);
    }
    c
}

/// [`utf8_read`] past a lead byte `c` (0xc0 and above).
fn utf8_rest(bytes: &[u8], at: &mut usize, lead: u32) -> u32 {
    let mut c = u32::from(UTF8_TRANS1[(lead - 0xc0) as usize]);
    while is_continuation(byte_at(bytes, *at)) {
        c = (c << 6) + u32::from(byte_at(bytes, *at) & 0x3f);
        *at += 1;
    }
    if c < 0x80 || (c & 0xffff_f800) == 0xd800 {
        c = 0xfffd;
    }
    c
}

/// `SQLITE_SKIP_UTF8`: moves `*at` past one character without decoding it.
fn skip_utf8(bytes: &[u8], at: &mut usize) {
    let lead = byte_at(bytes, *at);
    *at += 1;
    if lead >= 0xc0 {
        while is_continuation(byte_at(bytes, *at)) {
            *at += 1;
        }
    }
}

/// `instr(X, Y)`: the 1-based position of the first `Y` in `X`, in bytes when both are blobs,
/// else in characters; 1 for an empty `Y`, 0 when absent, NULL when either is NULL.
fn instr(ctx: &Context<'_>) -> rusqlite::Result<Option<i64>> {
    let (haystack, needle) = (ctx.get_raw(0), ctx.get_raw(1));
    let blobs = matches!((haystack, needle), (ValueRef::Blob(_), ValueRef::Blob(_)));
    let (Some(haystack), Some(needle)) = (text_of(haystack)?, text_of(needle)?) else {
        return Ok(None);
    };
    if needle.is_empty() {
        return Ok(Some(1));
    }
    if blobs {
        let found = memmem::find(&haystack, &needle);
        return Ok(Some(found.map_or(0, |at| position(at + 1))));
    }
    // SQLite tries the needle at the start and at every byte that starts a character (is not a
    // continuation byte), counting those tries. A needle that starts with a continuation byte
    // can only match at the start; any other match is at a character start.
    if is_continuation(needle[0]) {
        return Ok(Some(i64::from(haystack.starts_with(&needle))));
    }
    let Some(at) = memmem::find(&haystack, &needle) else {
        return Ok(Some(0));
    };
    let tries_before = if at == 0 {
        0
    } else {
        1 + haystack[1..at]
            .iter()
            .filter(|&&b| !is_continuation(b))
            .count()
    };
    Ok(Some(position(tries_before + 1)))
}

fn position(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `replace(X, Y, Z)`: every non-overlapping `Y` in `X`, left to right and byte by byte,
/// replaced with `Z`. `X` comes back unchanged when `Y` is empty or starts with a NUL byte;
/// NULL when `X`, `Y` or (for a non-empty `Y`) `Z` is NULL; "string or blob too big" past the
/// value limit (and, as SQLite's buffer of `X`'s length plus one is checked against it, for an
/// `X` of exactly the limit). The result is always text.
fn replace(ctx: &Context<'_>, max_length: usize) -> rusqlite::Result<Option<RawText>> {
    let Some(text) = text_of(ctx.get_raw(0))? else {
        return Ok(None);
    };
    let Some(pattern) = text_of(ctx.get_raw(1))? else {
        return Ok(None);
    };
    if pattern.first().is_none_or(|&b| b == 0) {
        return Ok(Some(RawText(text.into_owned())));
    }
    let Some(with) = text_of(ctx.get_raw(2))? else {
        return Ok(None);
    };
    if text.len() + 1 > max_length {
        return Err(failure(ffi::SQLITE_TOOBIG, None));
    }
    let mut out = Vec::with_capacity(text.len());
    let mut copied = 0;
    for at in memmem::find_iter(&text, &pattern[..]) {
        let grown = out.len() + (at - copied) + with.len() + (text.len() - at - pattern.len());
        if with.len() > pattern.len() && grown > max_length {
            return Err(failure(ffi::SQLITE_TOOBIG, None));
        }
        out.extend_from_slice(&text[copied..at]);
        out.extend_from_slice(&with);
        copied = at + pattern.len();
    }
    out.extend_from_slice(&text[copied..]);
    Ok(Some(RawText(out)))
}

/// Which ends `trim` works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sides {
    left: bool,
    right: bool,
}

impl Sides {
    const LEFT: Sides = Sides {
        left: true,
        right: false,
    };
    const RIGHT: Sides = Sides {
        left: false,
        right: true,
    };
    const BOTH: Sides = Sides {
        left: true,
        right: true,
    };
}

/// The characters of a `trim` set, split as SQLite splits them (`SQLITE_SKIP_UTF8` up to the
/// first NUL), each with its first position in the set: SQLite removes, at each step, the
/// earliest character of the set that the input starts (or ends) with.
struct TrimSet<'a> {
    /// One-byte characters: their first position, or `u32::MAX`.
    single: [u32; 256],
    /// Longer characters (a lead byte and continuation bytes): their first position.
    multi: HashMap<&'a [u8], u32>,
    /// The distinct lengths in `multi`, ascending.
    lengths: Vec<usize>,
    /// How many characters the set has, repeats included.
    characters: usize,
}

impl<'a> TrimSet<'a> {
    fn new(set: &'a [u8]) -> TrimSet<'a> {
        let mut trim_set = TrimSet {
            single: [u32::MAX; 256],
            multi: HashMap::new(),
            lengths: Vec::new(),
            characters: 0,
        };
        let mut at = 0;
        let mut index = 0u32;
        while at < set.len() {
            let start = at;
            skip_utf8(set, &mut at);
            let at_end = at.min(set.len());
            let character = &set[start..at_end];
            if let [byte] = character {
                let slot = &mut trim_set.single[usize::from(*byte)];
                *slot = (*slot).min(index);
            } else {
                trim_set.multi.entry(character).or_insert(index);
                trim_set.lengths.push(character.len());
            }
            index = index.saturating_add(1);
            trim_set.characters += 1;
        }
        trim_set.lengths.sort_unstable();
        trim_set.lengths.dedup();
        trim_set
    }

    fn is_empty(&self) -> bool {
        self.characters == 0
    }

    fn longest(&self) -> usize {
        self.lengths.last().copied().unwrap_or(1)
    }

    /// The length of the earliest set character `rest` starts with.
    fn at_start(&self, rest: &[u8], budget: &mut Budget<'_>) -> rusqlite::Result<Option<usize>> {
        let lead = rest[0];
        let mut best = (self.single[usize::from(lead)], 1);
        if lead >= 0xc0 && !self.lengths.is_empty() {
            // A longer set character is the lead byte and continuation bytes only.
            let run = rest[1..]
                .iter()
                .take(self.longest())
                .take_while(|&&b| is_continuation(b))
                .count();
            budget.spend(run)?;
            for &length in &self.lengths {
                if length > run + 1 {
                    break;
                }
                budget.spend(length)?;
                if let Some(&index) = self.multi.get(&rest[..length])
                    && index < best.0
                {
                    best = (index, length);
                }
            }
        }
        Ok((best.0 != u32::MAX).then_some(best.1))
    }

    /// The length of the earliest set character `rest` ends with.
    fn at_end(&self, rest: &[u8], budget: &mut Budget<'_>) -> rusqlite::Result<Option<usize>> {
        let last = rest[rest.len() - 1];
        let mut best = (self.single[usize::from(last)], 1);
        if !self.lengths.is_empty() {
            // Only one longer character can end the input: its lead byte followed by all of
            // the trailing continuation bytes.
            let run = rest
                .iter()
                .rev()
                .take(self.longest())
                .take_while(|&&b| is_continuation(b))
                .count();
            budget.spend(run)?;
            let length = run + 1;
            if run > 0
                && length <= rest.len()
                && rest[rest.len() - length] >= 0xc0
                && self.lengths.binary_search(&length).is_ok()
            {
                budget.spend(length)?;
                if let Some(&index) = self.multi.get(&rest[rest.len() - length..])
                    && index < best.0
                {
                    best = (index, length);
                }
            }
        }
        Ok((best.0 != u32::MAX).then_some(best.1))
    }
}

/// `trim(X)`, `trim(X, Y)` and the `ltrim`/`rtrim` forms: `X` without the characters of `Y`
/// (a space by default) at the chosen ends. NULL when `X` or `Y` is NULL; the result is text.
/// "string or blob too big" when SQLite's table of the set's characters (a pointer and a
/// length each) would pass the value limit.
fn trim(
    ctx: &Context<'_>,
    sides: Sides,
    max_length: usize,
    hooks: &Hooks,
) -> rusqlite::Result<Option<RawText>> {
    let Some(input) = text_of(ctx.get_raw(0))? else {
        return Ok(None);
    };
    let set = if ctx.len() == 1 {
        Cow::Borrowed(&b" "[..])
    } else {
        match text_of(ctx.get_raw(1))? {
            Some(set) => set,
            None => return Ok(None),
        }
    };
    let given = ctx.len() == 2;
    let set = TrimSet::new(up_to_nul(&set));
    let table_bytes = set
        .characters
        .saturating_mul(std::mem::size_of::<usize>() + std::mem::size_of::<u32>());
    if given && set.characters > 0 && table_bytes > max_length {
        return Err(failure(ffi::SQLITE_TOOBIG, None));
    }
    let (mut start, mut end) = (0, input.len());
    if !set.is_empty() {
        let mut budget = Budget::new(hooks);
        if sides.left {
            while start < end {
                budget.spend(1)?;
                match set.at_start(&input[start..end], &mut budget)? {
                    Some(length) => start += length,
                    None => break,
                }
            }
        }
        if sides.right {
            while start < end {
                budget.spend(1)?;
                match set.at_end(&input[start..end], &mut budget)? {
                    Some(length) => end -= length,
                    None => break,
                }
            }
        }
    }
    Ok(Some(RawText(input[start..end].to_vec())))
}

/// The characters `unhex`'s second argument allows between hex pairs, as code points
/// decoded by `sqlite3Utf8Read`: ASCII in a bitmap, the rest sorted (no allocation for the
/// usual separators, and a lookup in O(log n) for a set of any size).
struct PassSet {
    ascii: [u64; 2],
    other: Vec<u32>,
}

impl PassSet {
    fn new(pass: &[u8]) -> PassSet {
        let mut set = PassSet {
            ascii: [0; 2],
            other: Vec::new(),
        };
        let mut at = 0;
        while at < pass.len() {
            let c = utf8_read(pass, &mut at);
            if c < 128 {
                set.ascii[(c / 64) as usize] |= 1 << (c % 64);
            } else {
                set.other.push(c);
            }
        }
        set.other.sort_unstable();
        set.other.dedup();
        set
    }

    fn contains(&self, c: u32) -> bool {
        if c < 128 {
            self.ascii[(c / 64) as usize] & (1 << (c % 64)) != 0
        } else {
            self.other.binary_search(&c).is_ok()
        }
    }
}

/// `unhex(X, Y)`: the blob whose hex digits `X` holds in pairs, with the characters of `Y`
/// allowed between pairs; NULL when either is NULL or `X` holds anything else. `X` ends at its
/// first NUL; `Y` is all its bytes. SQLite's buffer (half of `X`'s bytes, plus one) is checked
/// against the value limit first.
fn unhex(ctx: &Context<'_>, max_length: usize) -> rusqlite::Result<Option<Vec<u8>>> {
    let (Some(hex), Some(pass)) = (text_of(ctx.get_raw(0))?, text_of(ctx.get_raw(1))?) else {
        return Ok(None);
    };
    if hex.len() / 2 + 1 > max_length {
        return Err(failure(ffi::SQLITE_TOOBIG, None));
    }
    let hex = up_to_nul(&hex);
    let pass = PassSet::new(&pass);
    let digit = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(hex.len() / 2);
    let mut at = 0;
    loop {
        let mut c = byte_at(hex, at);
        if c == 0 {
            return Ok(Some(out));
        }
        while digit(c).is_none() {
            let skipped = utf8_read(hex, &mut at);
            if !pass.contains(skipped) {
                return Ok(None);
            }
            c = byte_at(hex, at);
            if c == 0 {
                return Ok(Some(out));
            }
        }
        let low = byte_at(hex, at + 1);
        at += 2;
        match (digit(c), digit(low)) {
            (Some(high), Some(low)) => out.push((high << 4) | low),
            _ => return Ok(None),
        }
    }
}

/// SQLite's `compareInfo`: the wildcards of `GLOB` or `LIKE`.
#[derive(Debug, Clone, Copy)]
struct CompareInfo {
    match_all: u32,
    match_one: u32,
    /// `[` for GLOB's character classes; 0 for LIKE.
    match_set: u32,
    no_case: bool,
}

const GLOB: CompareInfo = CompareInfo {
    match_all: '*' as u32,
    match_one: '?' as u32,
    match_set: '[' as u32,
    no_case: false,
};

/// LIKE is case-insensitive for ASCII (clients cannot set `case_sensitive_like`).
const LIKE: CompareInfo = CompareInfo {
    match_all: '%' as u32,
    match_one: '_' as u32,
    match_set: 0,
    no_case: true,
};

/// Where the innermost `*` or `%` goes on looking when the rest of the pattern fails from its
/// last try.
#[derive(Debug, Clone, Copy)]
enum Resume {
    /// The wildcard is followed by the ASCII character `stops` (either case for LIKE): the rest
    /// of the pattern (from `rest`) is tried just past each one, the next search from `next`.
    Ascii {
        stops: [u8; 2],
        rest: usize,
        next: usize,
    },
    /// The same for a character `c` of two bytes or more.
    Char { c: u32, rest: usize, next: usize },
    /// `[...]` right after `*`: the class and the rest (from `class`) are tried at every
    /// character, the next at `next`.
    Every { class: usize, next: usize },
}

fn ascii_lower(c: u32) -> u32 {
    if (u32::from(b'A')..=u32::from(b'Z')).contains(&c) {
        c + 32
    } else {
        c
    }
}

fn ascii_upper(c: u32) -> u32 {
    if (u32::from(b'a')..=u32::from(b'z')).contains(&c) {
        c - 32
    } else {
        c
    }
}

/// Whether `string` matches `pattern` (each ending at its first NUL), as SQLite's
/// `patternCompare` decides, with the job's clock consulted as it goes: for a string of N
/// characters and a pattern segment of M it does up to N×M comparisons.
///
/// SQLite's function recurses once per wildcard, but only the innermost wildcard's search is
/// ever resumed: a call that reaches a further wildcard returns a match or "no match anywhere"
/// (`SQLITE_NOWILDCARDMATCH`), which every caller returns as it is. So this is SQLite's loop,
/// statement for statement, with the recursion replaced by that one search position: constant
/// stack whatever the pattern (SQLite's own recursion is as deep as the pattern has wildcards).
fn pattern_compare(
    pattern: &[u8],
    string: &[u8],
    info: &CompareInfo,
    match_other: u32,
    budget: &mut Budget<'_>,
) -> rusqlite::Result<bool> {
    let (match_one, match_all, no_case) = (info.match_one, info.match_all, info.no_case);
    let mut resume: Option<Resume> = None;
    let (mut p, mut s) = (0, 0);
    // Where the pattern was just after its last escaped character.
    let mut escaped: Option<usize> = None;
    loop {
        // One call of SQLite's patternCompare from (p, s); a final outcome returns at once,
        // a mismatch falls through to the innermost wildcard's next try.
        'call: loop {
            budget.spend(1)?;
            let mut c = utf8_read(pattern, &mut p);
            if c == 0 {
                if byte_at(string, s) == 0 {
                    return Ok(true);
                }
                break 'call;
            }
            if c == match_all {
                // Skip further `*` and `?`, each `?` taking one input character.
                loop {
                    c = utf8_read(pattern, &mut p);
                    if !(c == match_all || (c == match_one && match_one != 0)) {
                        break;
                    }
                    if c == match_one && utf8_read(string, &mut s) == 0 {
                        return Ok(false);
                    }
                }
                if c == 0 {
                    return Ok(true);
                }
                if c == match_other {
                    if info.match_set == 0 {
                        c = utf8_read(pattern, &mut p);
                        if c == 0 {
                            return Ok(false);
                        }
                    } else {
                        resume = Some(Resume::Every {
                            class: p - 1,
                            next: s,
                        });
                        break 'call;
                    }
                }
                resume = Some(if c < 0x80 {
                    let stops = if no_case {
                        [ascii_upper(c) as u8, ascii_lower(c) as u8]
                    } else {
                        [c as u8, c as u8]
                    };
                    Resume::Ascii {
                        stops,
                        rest: p,
                        next: s,
                    }
                } else {
                    Resume::Char {
                        c,
                        rest: p,
                        next: s,
                    }
                });
                break 'call;
            }
            if c == match_other {
                if info.match_set == 0 {
                    c = utf8_read(pattern, &mut p);
                    if c == 0 {
                        break 'call;
                    }
                    escaped = Some(p);
                } else {
                    let mut prior_c = 0;
                    let mut seen = false;
                    let mut invert = false;
                    let c = utf8_read(string, &mut s);
                    if c == 0 {
                        break 'call;
                    }
                    let mut c2 = utf8_read(pattern, &mut p);
                    if c2 == u32::from(b'^') {
                        invert = true;
                        c2 = utf8_read(pattern, &mut p);
                    }
                    if c2 == u32::from(b']') {
                        if c == u32::from(b']') {
                            seen = true;
                        }
                        c2 = utf8_read(pattern, &mut p);
                    }
                    while c2 != 0 && c2 != u32::from(b']') {
                        budget.spend(1)?;
                        let next = byte_at(pattern, p);
                        if c2 == u32::from(b'-') && next != b']' && next != 0 && prior_c > 0 {
                            c2 = utf8_read(pattern, &mut p);
                            if c >= prior_c && c <= c2 {
                                seen = true;
                            }
                            prior_c = 0;
                        } else {
                            if c == c2 {
                                seen = true;
                            }
                            prior_c = c2;
                        }
                        c2 = utf8_read(pattern, &mut p);
                    }
                    if c2 == 0 || seen == invert {
                        break 'call;
                    }
                    continue;
                }
            }
            let c2 = utf8_read(string, &mut s);
            if c == c2 {
                continue;
            }
            if no_case && c < 0x80 && c2 < 0x80 && ascii_lower(c) == ascii_lower(c2) {
                continue;
            }
            if c == match_one && escaped != Some(p) && c2 != 0 {
                continue;
            }
            break 'call;
        }
        // The innermost wildcard's next try: a new call from there, or no match anywhere.
        let Some(next_try) = resume.as_mut() else {
            return Ok(false);
        };
        match next_try {
            Resume::Ascii { stops, rest, next } => {
                let tail = string.get(*next..).unwrap_or_default();
                let skipped = memchr::memchr2(stops[0], stops[1], tail).unwrap_or(tail.len());
                budget.spend(skipped + 1)?;
                let at = *next + skipped;
                if byte_at(string, at) == 0 {
                    return Ok(false);
                }
                *next = at + 1;
                (p, s) = (*rest, at + 1);
            }
            Resume::Char { c, rest, next } => {
                loop {
                    let c2 = utf8_read(string, next);
                    if c2 == 0 {
                        return Ok(false);
                    }
                    budget.spend(1)?;
                    if c2 == *c {
                        break;
                    }
                }
                (p, s) = (*rest, *next);
            }
            Resume::Every { class, next } => {
                if byte_at(string, *next) == 0 {
                    return Ok(false);
                }
                budget.spend(1)?;
                (p, s) = (*class, *next);
                skip_utf8(string, next);
            }
        }
        escaped = None;
    }
}

/// `like(P, X)`, `like(P, X, E)` (`X LIKE P [ESCAPE E]`) and `glob(P, X)` (`X GLOB P`), as
/// SQLite's `likeFunc`: 1 or 0, NULL when any argument is NULL; "LIKE or GLOB pattern too
/// complex" past the pattern limit (checked first), and an escape must be one character.
fn like(
    ctx: &Context<'_>,
    mut info: CompareInfo,
    pattern_limit: usize,
    hooks: &Hooks,
) -> rusqlite::Result<Option<i64>> {
    let pattern = text_of(ctx.get_raw(0))?;
    if pattern.as_ref().map_or(0, |p| p.len()) > pattern_limit {
        return Err(failure(
            ffi::SQLITE_ERROR,
            Some("LIKE or GLOB pattern too complex"),
        ));
    }
    let escape = if ctx.len() == 3 {
        let Some(escape) = text_of(ctx.get_raw(2))? else {
            return Ok(None);
        };
        let escape = up_to_nul(&escape);
        let mut characters = 0;
        let mut at = 0;
        while at < escape.len() {
            skip_utf8(escape, &mut at);
            characters += 1;
        }
        if characters != 1 {
            return Err(failure(
                ffi::SQLITE_ERROR,
                Some("ESCAPE expression must be a single character"),
            ));
        }
        let escape = utf8_read(escape, &mut 0);
        if escape == info.match_all {
            info.match_all = 0;
        }
        if escape == info.match_one {
            info.match_one = 0;
        }
        escape
    } else {
        info.match_set
    };
    let (Some(pattern), Some(string)) = (pattern, text_of(ctx.get_raw(1))?) else {
        return Ok(None);
    };
    let mut budget = Budget::new(hooks);
    let found = pattern_compare(
        up_to_nul(&pattern),
        up_to_nul(&string),
        &info,
        escape,
        &mut budget,
    )?;
    Ok(Some(i64::from(found)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use proptest::prelude::*;
    use rusqlite::types::Value;

    use crate::engine::sqlite::control::JobControl;

    fn idle_hooks() -> Arc<Hooks> {
        Arc::new(Hooks::new(Arc::new(AtomicBool::new(false))))
    }

    /// A plain connection (SQLite's built-ins) and one with the replacements.
    fn pair() -> (Connection, Connection) {
        let builtin = Connection::open_in_memory().unwrap();
        let replaced = Connection::open_in_memory().unwrap();
        register(&replaced, &idle_hooks()).unwrap();
        (builtin, replaced)
    }

    /// [`pair`] with tiny value and LIKE-pattern limits, so inputs reach them.
    fn limited_pair() -> (Connection, Connection) {
        let builtin = Connection::open_in_memory().unwrap();
        let replaced = Connection::open_in_memory().unwrap();
        for conn in [&builtin, &replaced] {
            conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, 24).unwrap();
            conn.set_limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 6)
                .unwrap();
        }
        register(&replaced, &idle_hooks()).unwrap();
        (builtin, replaced)
    }

    /// One argument: a bound value, or text made of any bytes (`CAST(blob AS TEXT)`).
    #[derive(Debug, Clone)]
    enum Arg {
        Value(Value),
        RawText(Vec<u8>),
    }

    /// The result of `sql` with `args` as `?1..`, or the error's code and message.
    fn outcome(conn: &Connection, sql: &str, args: &[Arg]) -> Result<Value, String> {
        let params: Vec<Value> = args
            .iter()
            .map(|arg| match arg {
                Arg::Value(v) => v.clone(),
                Arg::RawText(bytes) => Value::Blob(bytes.clone()),
            })
            .collect();
        conn.prepare(sql)
            .and_then(|mut stmt| {
                stmt.query_row(rusqlite::params_from_iter(params), |row| {
                    let value: Value = row.get(0)?;
                    let kind: String = row.get(1)?;
                    Ok((value, kind))
                })
            })
            .map(|(value, kind)| match value {
                // Text with invalid UTF-8 comes back as bytes: compare bytes and type.
                Value::Blob(b) => Value::Text(format!("{kind}:{b:?}")),
                other => other,
            })
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, m) => format!("{:?}: {m:?}", f.code),
                other => other.to_string(),
            })
    }

    /// `call` (a function call over `?1..?n`) on both connections.
    fn same(builtin: &Connection, replaced: &Connection, call: &str, args: &[Arg]) {
        let mut call = call.to_owned();
        for (i, arg) in args.iter().enumerate().rev() {
            if let Arg::RawText(_) = arg {
                call = call.replace(&format!("?{}", i + 1), &format!("CAST(?{} AS TEXT)", i + 1));
            }
        }
        // The raw bytes and type of the result, whatever its encoding.
        let sql = format!(
            "SELECT CASE typeof(r) WHEN 'text' THEN CAST(r AS BLOB) ELSE r END, typeof(r) \
             FROM (SELECT {call} AS r)"
        );
        assert_eq!(
            outcome(replaced, &sql, args),
            outcome(builtin, &sql, args),
            "{call} with {args:?}"
        );
    }

    const PIECES: &[&str] = &[
        "a", "A", "b", "B", "z", "Z", " ", "%", "_", "*", "?", "[", "]", "^", "-", "\\", "x", "é",
        "É", "€", "😀", "\u{0}", "\u{fffd}", "ab", "aa", "1", "0", ".",
    ];
    const RAW_PIECES: &[&[u8]] = &[
        b"\x80",
        b"\xbf",
        b"\xc0",
        b"\xc3",
        b"\xc3\xa9",
        b"\xe2\x82",
        b"\xf0\x9f",
        b"\xff",
        b"\xed\xa0\x80",
        b"\xc0\x80",
        b"\xf8\x88\x80\x80\x80",
        b"a",
        b"%",
        b"\x00",
    ];

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(PIECES), 0..12).prop_map(|p| p.concat())
    }

    fn raw() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(RAW_PIECES), 0..10).prop_map(|p| p.concat())
    }

    fn arg() -> impl Strategy<Value = Arg> {
        prop_oneof![
            1 => Just(Arg::Value(Value::Null)),
            6 => text().prop_map(|t| Arg::Value(Value::Text(t))),
            2 => raw().prop_map(|b| Arg::Value(Value::Blob(b))),
            3 => raw().prop_map(Arg::RawText),
            1 => prop_oneof![Just(0i64), Just(-1), Just(10), Just(101), any::<i64>()]
                .prop_map(|i| Arg::Value(Value::Integer(i))),
            1 => prop_oneof![
                Just(0.0f64), Just(-0.0), Just(1.0), Just(0.1), Just(-2.5), Just(1e15),
                Just(1e300), Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(123456789.0),
                any::<f64>().prop_filter("NaN is NULL", |f| !f.is_nan()),
            ]
            .prop_map(|r| Arg::Value(Value::Real(r))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn two_argument_functions_match_sqlite(a in arg(), b in arg(), limited: bool) {
            let (builtin, replaced) = if limited { limited_pair() } else { pair() };
            for call in [
                "instr(?1, ?2)", "trim(?1, ?2)", "ltrim(?1, ?2)", "rtrim(?1, ?2)",
                "unhex(?1, ?2)", "like(?1, ?2)", "glob(?1, ?2)", "?2 LIKE ?1", "?2 GLOB ?1",
                "?2 NOT LIKE ?1",
            ] {
                same(&builtin, &replaced, call, &[a.clone(), b.clone()]);
            }
            for call in ["trim(?1)", "ltrim(?1)", "rtrim(?1)"] {
                same(&builtin, &replaced, call, std::slice::from_ref(&a));
            }
        }

        #[test]
        fn three_argument_functions_match_sqlite(
            a in arg(), b in arg(), c in arg(), limited: bool
        ) {
            let (builtin, replaced) = if limited { limited_pair() } else { pair() };
            for call in ["replace(?1, ?2, ?3)", "like(?1, ?2, ?3)", "?2 LIKE ?1 ESCAPE ?3"] {
                same(&builtin, &replaced, call, &[a.clone(), b.clone(), c.clone()]);
            }
        }

        #[test]
        fn like_and_glob_patterns_match_sqlite(
            pattern in prop::collection::vec(
                prop::sample::select(&["%", "_", "*", "?", "[", "]", "^", "-", "a", "A", "b",
                    "é", "\\", "[a-c]", "[^a]", "[^é]", "[]]", "\\%", "\\_"][..]), 0..6)
                .prop_map(|p| p.concat()),
            string in prop::collection::vec(
                prop::sample::select(&["a", "A", "b", "B", "c", "é", "É", "%", "_", "]", "-",
                    "\\", "*", "?"][..]), 0..6)
                .prop_map(|p| p.concat()),
            escape in prop::sample::select(&["\\", "%", "_", "a", "é", "[", "*"][..]),
        ) {
            let (builtin, replaced) = pair();
            let args = [
                Arg::Value(Value::Text(pattern)),
                Arg::Value(Value::Text(string)),
                Arg::Value(Value::Text(escape.to_owned())),
            ];
            for call in ["like(?1, ?2)", "glob(?1, ?2)", "like(?1, ?2, ?3)"] {
                same(&builtin, &replaced, call, &args);
            }
        }

        #[test]
        fn trim_sets_with_shared_prefixes_match_sqlite(
            input in raw(), set in raw(), extra in text()
        ) {
            let (builtin, replaced) = pair();
            let mut input = input;
            input.extend_from_slice(extra.as_bytes());
            for call in ["trim(?1, ?2)", "ltrim(?1, ?2)", "rtrim(?1, ?2)", "instr(?1, ?2)",
                         "replace(?1, ?2, 'é')", "unhex(?1, ?2)"] {
                same(&builtin, &replaced, call,
                     &[Arg::RawText(input.clone()), Arg::RawText(set.clone())]);
            }
        }
    }

    #[test]
    fn edge_cases_match_sqlite() {
        let (builtin, replaced) = pair();
        let t = |s: &str| Arg::Value(Value::Text(s.to_owned()));
        let b = |s: &[u8]| Arg::Value(Value::Blob(s.to_vec()));
        let cases: Vec<(&str, Vec<Arg>)> = vec![
            ("instr(?1, ?2)", vec![t("héllo wörld"), t("wö")]),
            ("instr(?1, ?2)", vec![b(b"\x00\x01\x02\x01"), b(b"\x01")]),
            ("instr(?1, ?2)", vec![b(b"h\xc3\xa9llo"), t("llo")]),
            ("instr(?1, ?2)", vec![t(""), t("")]),
            (
                "instr(?1, ?2)",
                vec![Arg::Value(Value::Real(12.5)), t(".5")],
            ),
            (
                "instr(?1, ?2)",
                vec![Arg::Value(Value::Integer(-1234)), t("34")],
            ),
            ("replace(?1, ?2, ?3)", vec![t("aaaa"), t("aa"), t("b")]),
            (
                "replace(?1, ?2, ?3)",
                vec![t("abc"), t(""), Arg::Value(Value::Null)],
            ),
            ("replace(?1, ?2, ?3)", vec![t("abc"), b(b"\x00b"), t("x")]),
            (
                "replace(?1, ?2, ?3)",
                vec![b(b"\x01\x02"), b(b"\x02"), b(b"\x03")],
            ),
            ("trim(?1, ?2)", vec![t("xxhixx"), t("x")]),
            ("trim(?1, ?2)", vec![t("éaé"), t("é")]),
            ("rtrim(?1, ?2)", vec![t("abc"), t("")]),
            ("ltrim(?1, ?2)", vec![t("abc"), t("a\u{0}b")]),
            ("unhex(?1, ?2)", vec![t("01 02-03"), t(" -")]),
            ("unhex(?1, ?2)", vec![t("0"), t("")]),
            ("unhex(?1, ?2)", vec![t("€01"), t("€")]),
            ("like(?1, ?2, ?3)", vec![t("a%"), t("abc"), t("")]),
            ("like(?1, ?2, ?3)", vec![t("a%"), t("abc"), t("ab")]),
            ("like(?1, ?2, ?3)", vec![t("a%"), t("a%"), t("%")]),
            ("like(?1, ?2)", vec![t("%É%"), t("xéx")]),
            ("like(?1, ?2)", vec![t("%B%"), t("abc")]),
            ("glob(?1, ?2)", vec![t("*[b-d]?"), t("xxcz")]),
            ("glob(?1, ?2)", vec![t("[]a]*"), t("]zz")]),
            ("glob(?1, ?2)", vec![t("[a-c]"), t("a")]),
            ("glob(?1, ?2)", vec![t("[a-c]"), t("c")]),
            ("glob(?1, ?2)", vec![t("[^a-c]"), t("d")]),
            ("glob(?1, ?2)", vec![t("[a-]"), t("-")]),
            ("glob(?1, ?2)", vec![t("*[^é]"), t("é")]),
            ("glob(?1, ?2)", vec![t("*[^é]x"), t("éaéx")]),
            ("like(?1, ?2, ?3)", vec![t("a\\_"), t("ab"), t("\\")]),
            ("like(?1, ?2, ?3)", vec![t("a\\_"), t("a_"), t("\\")]),
            ("like(?1, ?2, ?3)", vec![t("a\\%"), t("abc"), t("\\")]),
            ("like(?1, ?2, ?3)", vec![t("%\\%"), t("50%"), t("\\")]),
        ];
        for (call, args) in &cases {
            same(&builtin, &replaced, call, args);
        }
        // Many wildcards: SQLite recurses once per wildcard, the port keeps one search position.
        for wildcard in ["%a", "*a", "%_", "*?", "*[a]", "%\\%"] {
            let pattern = format!("{}b", wildcard.repeat(1500));
            for string in ["a".repeat(4000), format!("{}b", "a".repeat(4000))] {
                for call in ["like(?1, ?2)", "glob(?1, ?2)", "like(?1, ?2, '\\')"] {
                    same(&builtin, &replaced, call, &[t(&pattern), t(&string)]);
                }
            }
        }
        // Past the pattern limit, and past the value limit.
        let (builtin_limited, replaced_limited) = {
            let builtin = Connection::open_in_memory().unwrap();
            let replaced = Connection::open_in_memory().unwrap();
            for conn in [&builtin, &replaced] {
                conn.set_limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 4)
                    .unwrap();
                conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, 100).unwrap();
            }
            register(&replaced, &idle_hooks()).unwrap();
            (builtin, replaced)
        };
        drop((builtin, replaced));
        for (call, args) in [
            ("like(?1, ?2)", vec![t("%aaaa"), Arg::Value(Value::Null)]),
            ("glob(?1, ?2)", vec![t("*aaa"), t("aaa")]),
            (
                "replace(?1, ?2, ?3)",
                vec![t(&format!("a{}", "c".repeat(98))), t("a"), t("bb")],
            ),
            (
                "replace(?1, ?2, ?3)",
                vec![t(&format!("a{}", "c".repeat(99))), t("a"), t("bb")],
            ),
            (
                "replace(?1, ?2, ?3)",
                vec![t(&"a".repeat(100)), t("a"), t("b")],
            ),
            (
                "replace(?1, ?2, ?3)",
                vec![t(&"a".repeat(99)), t("a"), t("b")],
            ),
            (
                "replace(?1, ?2, ?3)",
                vec![t(&"a".repeat(100)), t(""), t("b")],
            ),
            ("trim(?1, ?2)", vec![t("abc"), t("abcdefghi")]),
            ("trim(?1, ?2)", vec![t("abc"), t("abcdefgh")]),
            ("trim(?1)", vec![t(&" ".repeat(100))]),
            ("unhex(?1, ?2)", vec![t(&"ab".repeat(50)), t(" ")]),
        ] {
            same(&builtin_limited, &replaced_limited, call, &args);
        }
    }

    #[test]
    fn the_finding_is_linear() {
        let (_, replaced) = pair();
        let started = std::time::Instant::now();
        let found: i64 = replaced
            .query_row(
                "SELECT instr(zeroblob(2*?1), zeroblob(?1)||x'01') + \
                 length(replace(printf('%.*c', 2*?1, 'a'), printf('%.*c', ?1, 'a')||'b', 'x')) + \
                 length(trim(printf('%.*c', ?1, 'a'), printf('%.*c', ?1, 'b')||'a')) + \
                 length(unhex(printf('%.*c', ?1, ' '), printf('%.*c', ?1, 'x')||' '))",
                [1 << 20],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(found, 2 << 20);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_long_match_stops_when_the_job_must() {
        let hooks = idle_hooks();
        let conn = Connection::open_in_memory().unwrap();
        register(&conn, &hooks).unwrap();
        let job = Arc::new(JobControl::default());
        job.start(Duration::ZERO);
        hooks.begin_job(Arc::clone(&job));
        let err = conn
            .query_row(
                "SELECT printf('%.*c', 4000000, 'a') LIKE '%'||printf('%.*c', 2000, 'a')||'b'",
                [],
                |row| row.get::<_, i64>(0),
            )
            .unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::OperationInterrupted),
            "{err}"
        );
        assert_eq!(
            job.stop_reason(),
            Some(crate::engine::sqlite::control::StopReason::Deadline)
        );
    }
}
