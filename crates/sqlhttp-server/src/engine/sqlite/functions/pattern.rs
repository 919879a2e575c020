//! The pattern family: `LIKE` and `GLOB`, SQLite's `patternCompare` ported statement for
//! statement with its recursion replaced by one resume position, asking the job's clock as it
//! goes.
//!
//! Knows SQLite's argument and error conventions (from the parent module) and nothing of the
//! connection they are registered on.

use rusqlite::ffi;
use rusqlite::functions::Context;

use super::utf8::{byte_at, skip_utf8, up_to_nul, utf8_read};
use super::{Budget, failure, text_of};
use crate::engine::sqlite::control::Hooks;

/// SQLite's `compareInfo`: the wildcards of `GLOB` or `LIKE`.
#[derive(Debug, Clone, Copy)]
pub(super) struct CompareInfo {
    match_all: u32,
    match_one: u32,
    /// `[` for GLOB's character classes; 0 for LIKE.
    match_set: u32,
    no_case: bool,
}

pub(super) const GLOB: CompareInfo = CompareInfo {
    match_all: '*' as u32,
    match_one: '?' as u32,
    match_set: '[' as u32,
    no_case: false,
};

/// LIKE is case-insensitive for ASCII (clients cannot set `case_sensitive_like`).
pub(super) const LIKE: CompareInfo = CompareInfo {
    match_all: '%' as u32,
    match_one: '_' as u32,
    match_set: 0,
    no_case: true,
};

/// Where the innermost `*` or `%` goes on looking when the rest of the pattern fails from its
/// last try.
#[derive(Debug, Clone, Copy)]
pub(super) enum Resume {
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

pub(super) fn ascii_lower(c: u32) -> u32 {
    if (u32::from(b'A')..=u32::from(b'Z')).contains(&c) {
        c + 32
    } else {
        c
    }
}

pub(super) fn ascii_upper(c: u32) -> u32 {
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
pub(super) fn pattern_compare(
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
pub(super) fn like(
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
