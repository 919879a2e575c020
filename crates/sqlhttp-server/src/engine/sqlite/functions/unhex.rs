//! `unhex(X, Y)` with the characters `Y` lets through looked up in a table, where SQLite scans
//! the whole set for every skipped character.
//!
//! Knows SQLite's argument and error conventions (from the parent module) and nothing of the
//! connection it is registered on.

use rusqlite::ffi;
use rusqlite::functions::Context;

use super::utf8::{byte_at, up_to_nul, utf8_read};
use super::{failure, text_of};

/// The characters `unhex`'s second argument allows between hex pairs, as code points
/// decoded by `sqlite3Utf8Read`: ASCII in a bitmap, the rest sorted (no allocation for the
/// usual separators, and a lookup in O(log n) for a set of any size).
pub(super) struct PassSet {
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
pub(super) fn unhex(ctx: &Context<'_>, max_length: usize) -> rusqlite::Result<Option<Vec<u8>>> {
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
