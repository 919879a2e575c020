//! The search family: `instr` and `replace`, linear with `memchr::memmem` where SQLite's own
//! compare the needle at every position.
//!
//! Knows SQLite's argument and error conventions (from the parent module) and nothing of the
//! connection they are registered on.

use memchr::memmem;
use rusqlite::ffi;
use rusqlite::functions::Context;
use rusqlite::types::ValueRef;

use super::utf8::is_continuation;
use super::{RawText, failure, text_of};

/// `instr(X, Y)`: the 1-based position of the first `Y` in `X`, in bytes when both are blobs,
/// else in characters; 1 for an empty `Y`, 0 when absent, NULL when either is NULL.
pub(super) fn instr(ctx: &Context<'_>) -> rusqlite::Result<Option<i64>> {
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

pub(super) fn position(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `replace(X, Y, Z)`: every non-overlapping `Y` in `X`, left to right and byte by byte,
/// replaced with `Z`. `X` comes back unchanged when `Y` is empty or starts with a NUL byte;
/// NULL when `X`, `Y` or (for a non-empty `Y`) `Z` is NULL; "string or blob too big" past the
/// value limit (and, as SQLite's buffer of `X`'s length plus one is checked against it, for an
/// `X` of exactly the limit). The result is always text.
pub(super) fn replace(ctx: &Context<'_>, max_length: usize) -> rusqlite::Result<Option<RawText>> {
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
