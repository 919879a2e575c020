//! Statement describe, the engine-neutral part: what an engine answers for
//! `POST /api/v1/describe/statement` ([`Described`]), the refusal of a statement that may write
//! to a request that may only read, and the text rule both engines apply to nullability
//! ([`nullability_knowable`]). Each engine's own `describe` prepares the statement under the
//! sandbox and the client's privileges, and runs nothing (see `docs/adr/0055-checked-queries.md`).
//!
//! Knows the protocol's error codes and the SQL lexer; nothing about HTTP or either engine.

use crate::engine::sql_text::{Dialect, skip_trivia};
use crate::protocol::error::{ApiError, ErrorCode};

/// What preparing a statement told of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Described {
    /// Each parameter's type where the engine inferred one (PostgreSQL), in order.
    pub(crate) params: Vec<Option<String>>,
    /// The result columns, in order.
    pub(crate) columns: Vec<DescribedColumn>,
    /// Whether the statement may write.
    pub(crate) may_write: bool,
}

/// One result column of a described statement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DescribedColumn {
    pub(crate) name: String,
    /// The engine's type name, when it has one (a SQLite expression has none).
    pub(crate) type_name: Option<String>,
    /// `Some(false)` for a `NOT NULL` table column read straight ([`nullability_knowable`]);
    /// `None` when not known.
    pub(crate) nullable: Option<bool>,
}

/// The answer for a statement that may write, described for a request that may only read: as
/// running it would be answered, nothing run.
pub(crate) fn read_only_refusal() -> ApiError {
    ApiError::new(
        ErrorCode::ReadOnly,
        "this request may only read (a read-only credential), and the statement may write; it \
         was not described",
    )
}

/// Words after which a table column's `NOT NULL` says nothing of the result's column: an
/// outer join gives NULL for the missing side, a compound select's columns are named after its
/// first select while its other selects give any value, and grouping sets (`ROLLUP`, `CUBE`,
/// `GROUPING SETS`) give NULL for the columns a subtotal row does not group by.
const NULLING_WORDS: &[&str] = &[
    "LEFT",
    "RIGHT",
    "FULL",
    "OUTER",
    "UNION",
    "EXCEPT",
    "INTERSECT",
    "ROLLUP",
    "CUBE",
    "GROUPING",
];

/// Whether a column's `NOT NULL` may be trusted for the statement `sql`: not when any word of
/// [`NULLING_WORDS`] appears in it outside literals and comments (a function named `left` is
/// enough to say "not known": refusing a guess is safe, a wrong `NOT NULL` is not).
pub(crate) fn nullability_knowable(sql: &str) -> bool {
    !mentions_any(sql, NULLING_WORDS)
}

/// Whether any of `words` (uppercase) appears in `sql` as a word outside literals, quoted
/// names and comments, under either engine's comment rules (PostgreSQL nests block comments,
/// SQLite does not): a word either reading finds counts.
pub(crate) fn mentions_any(sql: &str, words: &[&str]) -> bool {
    [Dialect::Sqlite, Dialect::Postgres]
        .into_iter()
        .any(|dialect| finds_word(sql, dialect, words))
}

fn finds_word(sql: &str, dialect: Dialect, words: &[&str]) -> bool {
    let bytes = sql.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        // Comments are skipped, and literals and quoted names below; anything else that looks
        // like a word counts.
        let next = skip_trivia(bytes, at, dialect, false);
        if next != at {
            at = next;
            continue;
        }
        let byte = bytes[at];
        if byte.is_ascii_alphabetic() || byte == b'_' {
            let start = at;
            while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
                at += 1;
            }
            let word = sql[start..at].to_ascii_uppercase();
            if words.contains(&word.as_str()) {
                return true;
            }
            continue;
        }
        if byte == b'\'' || byte == b'"' || byte == b'`' || byte == b'[' {
            at = skip_literal(bytes, at);
            continue;
        }
        at += 1;
    }
    false
}

/// The end of the quoted literal or identifier starting at `at`.
fn skip_literal(bytes: &[u8], at: usize) -> usize {
    let close = match bytes[at] {
        b'[' => b']',
        quote => quote,
    };
    let mut i = at + 1;
    while i < bytes.len() {
        if bytes[i] == close {
            if close != b']' && bytes.get(i + 1) == Some(&close) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outer_joins_and_compound_selects_make_nullability_unknown() {
        assert!(nullability_knowable(
            "SELECT id, title FROM books WHERE id = ?"
        ));
        assert!(nullability_knowable(
            "SELECT a.id FROM a JOIN b ON a.id = b.id"
        ));
        assert!(nullability_knowable(
            "SELECT 'left join' AS x, \"union\" FROM t -- union"
        ));
        for sql in [
            "SELECT a.id FROM a LEFT JOIN b ON true",
            "select b.id from a right outer join b on true",
            "SELECT id FROM a UNION ALL SELECT NULL",
            "SELECT id, count(*) FROM t GROUP BY ROLLUP (id)",
            "SELECT id, count(*) FROM t GROUP BY cube(id)",
            "SELECT id, count(*) FROM t GROUP BY GROUPING SETS ((id), ())",
            "SELECT id FROM a\nEXCEPT SELECT id FROM b",
            "SELECT id FROM a INTERSECT SELECT 1",
            "SELECT a.x FROM a FULL JOIN b USING (x)",
            "SELECT a.x FROM a /* /* */ LEFT JOIN b USING (x) -- */",
        ] {
            assert!(!nullability_knowable(sql), "{sql}");
        }
    }
}
