//! The trim family: `trim`, `ltrim` and `rtrim`, with the set's characters looked up in a table
//! where SQLite compares every input character with every character of the set.
//!
//! Knows SQLite's argument and error conventions (from the parent module) and nothing of the
//! connection they are registered on.

use std::borrow::Cow;
use std::collections::HashMap;

use rusqlite::ffi;
use rusqlite::functions::Context;

use super::utf8::{is_continuation, skip_utf8, up_to_nul};
use super::{Budget, RawText, failure, text_of};
use crate::engine::sqlite::control::Hooks;

/// Which ends `trim` works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sides {
    left: bool,
    right: bool,
}

impl Sides {
    pub(super) const LEFT: Sides = Sides {
        left: true,
        right: false,
    };
    pub(super) const RIGHT: Sides = Sides {
        left: false,
        right: true,
    };
    pub(super) const BOTH: Sides = Sides {
        left: true,
        right: true,
    };
}

/// The characters of a `trim` set, split as SQLite splits them (`SQLITE_SKIP_UTF8` up to the
/// first NUL), each with its first position in the set: SQLite removes, at each step, the
/// earliest character of the set that the input starts (or ends) with.
pub(super) struct TrimSet<'a> {
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
pub(super) fn trim(
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
