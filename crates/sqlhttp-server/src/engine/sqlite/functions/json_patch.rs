//! `json_patch` and `jsonb_patch` (RFC 7396 merge) in time linear in their input, registered
//! in place of SQLite's, whose one call is quadratic in the number of keys: for every member of
//! the patch it scans the target object from its start (40 000 keys: 3.9 s in one VM step, past
//! every clock).
//!
//! Both arguments are first put in canonical form by SQLite itself: the engine thread's private
//! plain connection runs `json()` on each (linear; it takes JSON5 and JSONB as the built-in does,
//! fails with the built-in's "malformed JSON", and renders minified text that keeps every
//! number's and string's text). The merge then works on that text: a target object is split
//! into members once, its labels looked up in a hash map keyed by the label's characters (as
//! SQLite's `jsonLabelCompare` decodes them), and the result is written once. Target key order
//! is kept, new keys come after in patch order, null members of the patch remove keys (or are
//! left out of new objects), a patch that is not an object replaces the target. `jsonb_patch`
//! converts that text to JSONB through the private connection's `jsonb()`.
//!
//! Lives beside the other replacements (`engine::functions`); knows nothing of requests or
//! HTTP. See `docs/adr/0026-bounded-built-ins-json-and-fts.md`.

use std::collections::HashMap;

use rusqlite::ffi;
use rusqlite::functions::{Context, SubType};
use rusqlite::types::{ToSqlOutput, ValueRef};

use super::{Budget, RawText, failure, with_renderer};
use crate::engine::sqlite::control::Hooks;

/// SQLite's `JSON_MAX_DEPTH`: how deep a merge may recurse.
const MAX_DEPTH: u32 = 1000;

/// SQLite's subtype for JSON text (`JSON_SUBTYPE`, 'J').
const JSON_SUBTYPE: u32 = 74;

/// SQLite's `JSON_INVALID_CHAR`, what a malformed escape decodes to.
const INVALID_CHAR: u32 = 0x99999;

/// Which of the two functions: the result as text or as JSONB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Output {
    Text,
    Jsonb,
}

/// A function's result: JSON text with SQLite's JSON subtype, a JSONB blob, or NULL.
pub(super) enum Patched {
    Null,
    Text(RawText),
    Jsonb(Vec<u8>),
}

impl rusqlite::functions::SqlFnOutput for Patched {
    fn to_sql(&self) -> rusqlite::Result<(ToSqlOutput<'_>, SubType)> {
        Ok(match self {
            Patched::Null => (ToSqlOutput::Borrowed(ValueRef::Null), None),
            Patched::Text(text) => (
                ToSqlOutput::Borrowed(ValueRef::Text(&text.0)),
                Some(JSON_SUBTYPE),
            ),
            Patched::Jsonb(blob) => (ToSqlOutput::Borrowed(ValueRef::Blob(blob)), None),
        })
    }
}

/// `json_patch(T, P)` or `jsonb_patch(T, P)`.
pub(super) fn json_patch(
    ctx: &Context<'_>,
    output: Output,
    max_length: usize,
    hooks: &Hooks,
) -> rusqlite::Result<Patched> {
    let (target, patch) = (ctx.get_raw(0), ctx.get_raw(1));
    if is_small(target, patch) {
        return builtin(target, patch, output);
    }
    // SQLite parses the target first: a NULL target is NULL whatever the patch.
    let Some(target) = canonical(target)? else {
        return Ok(Patched::Null);
    };
    let Some(patch) = canonical(patch)? else {
        return Ok(Patched::Null);
    };
    let mut budget = Budget::new(hooks);
    let merged = merge(Node::Raw(&target), &patch, 0, &mut budget)?;
    let mut text = Vec::with_capacity(target.len().max(patch.len()));
    merged.render(&mut text);
    if text.len() > max_length {
        return Err(failure(ffi::SQLITE_TOOBIG, None));
    }
    match output {
        Output::Text => Ok(Patched::Text(RawText(text))),
        Output::Jsonb => {
            let blob = with_renderer(|conn| {
                conn.prepare_cached("SELECT jsonb(?1)")?
                    .query_row([RawText(text)], |row| row.get::<_, Vec<u8>>(0))
            })?;
            if blob.len() > max_length {
                return Err(failure(ffi::SQLITE_TOOBIG, None));
            }
            Ok(Patched::Jsonb(blob))
        }
    }
}

/// Calls up to this size (both arguments together) are given to the built-in on the private
/// connection: one query there is cheaper than two `json()` conversions and a merge, and SQLite's
/// quadratic merge is fast at this size (a few thousand labels at most: about a millisecond).
/// The unit tests set it to 0 for text, so that they compare the merge itself.
const BUILTIN_BYTES: usize = if cfg!(test) { 0 } else { 16 * 1024 };

/// The same for calls with a blob argument, also in the unit tests: SQLite takes a blob as JSONB
/// after checking its outer header only, and copies what it does not look into, where `json()`
/// renders or refuses it.
const BUILTIN_BLOB_BYTES: usize = 16 * 1024;

fn is_small(target: ValueRef<'_>, patch: ValueRef<'_>) -> bool {
    let is_blob = |value: &ValueRef<'_>| matches!(value, ValueRef::Blob(_));
    let size = |value: &ValueRef<'_>| match value {
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => bytes.len(),
        _ => 0,
    };
    let limit = if is_blob(&target) || is_blob(&patch) {
        BUILTIN_BLOB_BYTES
    } else {
        BUILTIN_BYTES
    };
    size(&target) + size(&patch) <= limit
}

/// The built-in's answer, from the private connection.
fn builtin(target: ValueRef<'_>, patch: ValueRef<'_>, output: Output) -> rusqlite::Result<Patched> {
    let sql = match output {
        Output::Text => "SELECT json_patch(?1, ?2)",
        Output::Jsonb => "SELECT jsonb_patch(?1, ?2)",
    };
    with_renderer(|conn| {
        conn.prepare_cached(sql)?.query_row(
            [ToSqlOutput::Borrowed(target), ToSqlOutput::Borrowed(patch)],
            |row| {
                Ok(match row.get_ref(0)? {
                    ValueRef::Text(text) => Patched::Text(RawText(text.to_vec())),
                    ValueRef::Blob(blob) => Patched::Jsonb(blob.to_vec()),
                    _ => Patched::Null,
                })
            },
        )
    })
}

/// `json(value)` from SQLite itself: minified text, or `None` for NULL; SQLite's error for what
/// is not JSON.
fn canonical(value: ValueRef<'_>) -> rusqlite::Result<Option<Vec<u8>>> {
    if value == ValueRef::Null {
        return Ok(None);
    }
    with_renderer(|conn| {
        conn.prepare_cached("SELECT json(?1)")?
            .query_row([ToSqlOutput::Borrowed(value)], |row| {
                Ok(match row.get_ref(0)? {
                    ValueRef::Text(text) | ValueRef::Blob(text) => Some(text.to_vec()),
                    ValueRef::Integer(i) => Some(i.to_string().into_bytes()),
                    ValueRef::Null | ValueRef::Real(_) => None,
                })
            })
    })
}

/// A value of the result: text kept as it was, or an object being merged.
enum Node<'a> {
    Raw(&'a [u8]),
    Object(Object<'a>),
}

impl Node<'_> {
    fn render(&self, out: &mut Vec<u8>) {
        match self {
            Node::Raw(text) => out.extend_from_slice(text),
            Node::Object(object) => {
                out.push(b'{');
                let mut first = true;
                for member in object.members.iter().flatten() {
                    if !first {
                        out.push(b',');
                    }
                    first = false;
                    out.extend_from_slice(member.label);
                    out.push(b':');
                    member.value.render(out);
                }
                out.push(b'}');
            }
        }
    }
}

/// One member of an object; `label` is the label's text with its quotes.
struct Member<'a> {
    label: &'a [u8],
    value: Node<'a>,
}

/// An object's members in order (`None` where one was removed) and where each label is.
#[derive(Default)]
struct Object<'a> {
    members: Vec<Option<Member<'a>>>,
    /// Member indexes, in order, by the label's characters as SQLite compares them.
    by_label: HashMap<Vec<u32>, Vec<usize>>,
}

impl<'a> Object<'a> {
    /// The members of the canonical object `text` (which starts with `{`).
    fn parse(text: &'a [u8], budget: &mut Budget<'_>) -> rusqlite::Result<Object<'a>> {
        let mut object = Object::default();
        let mut members = Members::of(text);
        while let Some((label, value)) = members.next(text, budget)? {
            object.push(label, Node::Raw(value));
        }
        Ok(object)
    }

    fn push(&mut self, label: &'a [u8], value: Node<'a>) {
        let index = self.members.len();
        self.members.push(Some(Member { label, value }));
        self.by_label
            .entry(label_chars(label))
            .or_default()
            .push(index);
    }

    /// The first member whose label SQLite finds equal to `label`.
    fn find(&self, label: &[u8], budget: &mut Budget<'_>) -> rusqlite::Result<Option<usize>> {
        let Some(candidates) = self.by_label.get(&label_chars(label)) else {
            return Ok(None);
        };
        budget.spend(candidates.len())?;
        Ok(candidates.iter().copied().find(|&i| {
            self.members[i]
                .as_ref()
                .is_some_and(|member| same_label(member.label, label))
        }))
    }

    fn remove(&mut self, index: usize) {
        if let Some(member) = self.members[index].take()
            && let Some(candidates) = self.by_label.get_mut(&label_chars(member.label))
        {
            candidates.retain(|&i| i != index);
        }
    }
}

/// `MergePatch(target, patch)` as SQLite's `jsonMergePatch` does it, at nesting `depth`.
fn merge<'a>(
    target: Node<'a>,
    patch: &'a [u8],
    depth: u32,
    budget: &mut Budget<'_>,
) -> rusqlite::Result<Node<'a>> {
    if patch.first() != Some(&b'{') {
        return Ok(Node::Raw(patch));
    }
    let mut object = match target {
        Node::Object(object) => object,
        Node::Raw(text) if text.first() == Some(&b'{') => Object::parse(text, budget)?,
        Node::Raw(_) => Object::default(),
    };
    let mut members = Members::of(patch);
    while let Some((label, value)) = members.next(patch, budget)? {
        let is_null = value == b"null";
        match object.find(label, budget)? {
            Some(index) if is_null => object.remove(index),
            Some(index) => {
                too_deep(depth)?;
                let Some(member) = object.members[index].as_mut() else {
                    continue;
                };
                let old = std::mem::replace(&mut member.value, Node::Raw(b"null"));
                member.value = merge(old, value, depth + 1, budget)?;
            }
            None if is_null => {}
            None if value.first() != Some(&b'{') => object.push(label, Node::Raw(value)),
            None => {
                too_deep(depth)?;
                let merged = merge(Node::Object(Object::default()), value, depth + 1, budget)?;
                object.push(label, merged);
            }
        }
    }
    Ok(Node::Object(object))
}

fn too_deep(depth: u32) -> rusqlite::Result<()> {
    if depth >= MAX_DEPTH {
        Err(failure(ffi::SQLITE_ERROR, Some("JSON nested too deep")))
    } else {
        Ok(())
    }
}

/// A walk over the members of a canonical object.
struct Members {
    at: usize,
}

impl Members {
    /// The members of `text`, which starts with `{`.
    fn of(text: &[u8]) -> Members {
        // Past `{`; an empty object has no member.
        let at = if text.get(1) == Some(&b'}') {
            text.len()
        } else {
            1
        };
        Members { at }
    }

    /// The next member of `text`: its label with quotes, and its value.
    fn next<'a>(
        &mut self,
        text: &'a [u8],
        budget: &mut Budget<'_>,
    ) -> rusqlite::Result<Option<(&'a [u8], &'a [u8])>> {
        let at = self.at;
        if text.get(at) != Some(&b'"') {
            return Ok(None);
        }
        let label_end = skip_string(text, at);
        let value_at = (label_end + 1).min(text.len());
        let value_end = skip_value(text, value_at, budget)?;
        // `,` then the next label, or the closing `}`.
        self.at = if text.get(value_end) == Some(&b',') {
            value_end + 1
        } else {
            text.len()
        };
        Ok(Some((&text[at..label_end], &text[value_at..value_end])))
    }
}

/// The end of the string whose opening quote is at `at` (past its closing quote).
fn skip_string(text: &[u8], at: usize) -> usize {
    let mut i = at + 1;
    while let Some(found) = text
        .get(i..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        if text[i + found] == b'\\' {
            i += found + 2;
        } else {
            return i + found + 1;
        }
    }
    text.len()
}

/// The end of the canonical value that starts at `at`.
fn skip_value(text: &[u8], at: usize, budget: &mut Budget<'_>) -> rusqlite::Result<usize> {
    let end = match text.get(at) {
        None => text.len(),
        Some(b'"') => skip_string(text, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match text.get(i) {
                    None => break text.len(),
                    Some(b'"') => i = skip_string(text, i),
                    Some(b'{' | b'[') => {
                        depth += 1;
                        i += 1;
                    }
                    Some(b'}' | b']') => {
                        depth = depth.saturating_sub(1);
                        i += 1;
                        if depth == 0 {
                            break i;
                        }
                    }
                    Some(_) => i += 1,
                }
            }
        }
        Some(_) => text[at..]
            .iter()
            .position(|&b| matches!(b, b',' | b'}' | b']'))
            .map_or(text.len(), |n| at + n),
    };
    budget.spend(end - at)?;
    Ok(end)
}

/// Whether two labels (with quotes) are equal as `jsonLabelCompare` decides, given that their
/// characters are (they share a [`label_chars`] key): labels without escapes compare as bytes.
fn same_label(left: &[u8], right: &[u8]) -> bool {
    let (left, right) = (content(left), content(right));
    if !left.contains(&b'\\') && !right.contains(&b'\\') {
        return left == right;
    }
    true
}

/// A label's text between its quotes.
fn content(label: &[u8]) -> &[u8] {
    label.get(1..label.len().saturating_sub(1)).unwrap_or(&[])
}

/// A label's characters as `jsonLabelCompareEscaped` reads them, up to the first NUL (the
/// comparison ends there): bytes below 0xc0 as themselves, longer UTF-8 as
/// `sqlite3Utf8ReadLimited` reads it, escapes as `jsonUnescapeOneChar` decodes them.
fn label_chars(label: &[u8]) -> Vec<u32> {
    let text = content(label);
    let escaped = text.contains(&b'\\');
    let mut chars = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let byte = text[i];
        let c = if escaped && byte == b'\\' {
            let (c, n) = unescape(&text[i..]);
            i += n;
            c
        } else if byte >= 0xc0 {
            super::utf8::utf8_read_limited(text, &mut i)
        } else {
            i += 1;
            u32::from(byte)
        };
        if c == 0 {
            break;
        }
        chars.push(c);
    }
    chars
}

/// `jsonUnescapeOneChar` for the escapes canonical JSON text has: the character and the
/// escape's length.
fn unescape(text: &[u8]) -> (u32, usize) {
    let hex4 = |at: usize| -> Option<u32> {
        let digits = text.get(at..at + 4)?;
        let digits = std::str::from_utf8(digits).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    match text.get(1) {
        None => (INVALID_CHAR, text.len()),
        Some(b'u') => {
            let Some(v) = hex4(2) else {
                return (INVALID_CHAR, text.len());
            };
            if v & 0xfc00 == 0xd800
                && text.get(6) == Some(&b'\\')
                && text.get(7) == Some(&b'u')
                && let Some(low) = hex4(8)
                && low & 0xfc00 == 0xdc00
            {
                return (((v & 0x3ff) << 10) + (low & 0x3ff) + 0x10000, 12);
            }
            (v, 6)
        }
        Some(b'b') => (0x08, 2),
        Some(b'f') => (0x0c, 2),
        Some(b'n') => (u32::from(b'\n'), 2),
        Some(b'r') => (u32::from(b'\r'), 2),
        Some(b't') => (u32::from(b'\t'), 2),
        Some(b'v') => (0x0b, 2),
        Some(&c @ (b'\'' | b'"' | b'/' | b'\\')) => (u32::from(c), 2),
        Some(_) => (INVALID_CHAR, 2),
    }
}

#[cfg(test)]
mod tests;
