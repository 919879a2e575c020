//! Rewriting the protocol's `?` placeholders into PostgreSQL's `$1..$n`.
//!
//! A small lexer walks the SQL text once and rewrites only the `?` that stand where a value
//! may: it copies string literals (`'..'` with `''`, `E'..'` with backslash escapes), quoted
//! identifiers (`".."`), line comments (`--`), nested block comments (`/* /* */ */`) and
//! dollar-quoted bodies (`$$..$$`, `$tag$..$tag$`) untouched. `?NNN` (SQLite's numbered form)
//! becomes `$NNN`; a bare `?` takes the number after the largest so far, as in SQLite. `??` is an
//! escaped `?`, for PostgreSQL's operators that contain one (`jsonb ?? 'key'` sends `jsonb ? 'key'`).
//!
//! It also finds the largest parameter number the text uses, `$N` written by the client
//! included, so a number past the request's parameters (or PostgreSQL's protocol limit of 65535)
//! is refused before PostgreSQL sees it ([`Rewritten::check_bound`]): PostgreSQL would size its
//! parameter array by the number first (`$268435455` allocates 1 GiB).
//!
//! The literal and comment skippers are `sql_text`'s, the lexer every text check uses. Pure text
//! in, text out: knows PostgreSQL's lexical rules, nothing about connections or HTTP.
//! Unterminated literals and comments are copied as they are; PostgreSQL reports them.

use crate::engine::sql_text::{is_ident_char, skip_block_comment, skip_dollar_quoted, skip_quoted};
use crate::protocol::error::ApiError;

/// The most parameters PostgreSQL's protocol can bind (a Bind message counts them in 16 bits).
pub(crate) const MAX_PARAMS: usize = 65535;

/// The SQL text with `$n` placeholders, and how many parameters it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rewritten {
    /// The text for PostgreSQL.
    pub(crate) sql: String,
    /// The largest placeholder number used, `$N` included (0 when there is none; `usize::MAX`
    /// for a number too large to read).
    pub(crate) params: usize,
}

impl Rewritten {
    /// Refuses (`400 SQL_ERROR`, naming it) a placeholder numbered past the `given` parameters
    /// or past [`MAX_PARAMS`], as SQLite refuses `?NNN` past its variable limit.
    pub(crate) fn check_bound(&self, given: usize) -> Result<(), ApiError> {
        if self.params <= given.min(MAX_PARAMS) {
            return Ok(());
        }
        let number = if self.params == usize::MAX {
            "a number too large to read".to_owned()
        } else {
            format!("${}", self.params)
        };
        Err(ApiError::sql(format!(
            "the statement uses parameter {number}, but the request gave {given} parameter(s); \
             a statement may use $1 to ${MAX_PARAMS} (or ?1 to ?{MAX_PARAMS}), and no more than \
             the request gives"
        )))
    }
}

/// Rewrites `sql`'s placeholders (see the module documentation).
pub(crate) fn rewrite(sql: &str) -> Rewritten {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut params = 0usize;
    // The largest `$N` the client wrote (a bare `?` still takes the number after the largest
    // `?`, as before: `$1, ?` is `$1, $1`).
    let mut written = 0usize;
    // Start of the text not yet copied to `out`.
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let previous_is_ident = i > 0 && is_ident_char(bytes[i - 1]);
        match c {
            b'\'' => {
                let escapes = i > 0
                    && matches!(bytes[i - 1], b'E' | b'e')
                    && !(i > 1 && is_ident_char(bytes[i - 2]));
                i = skip_quoted(bytes, i + 1, b'\'', escapes);
            }
            b'"' => i = skip_quoted(bytes, i + 1, b'"', false),
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = bytes[i..]
                    .iter()
                    .position(|&b| b == b'\n' || b == b'\r')
                    .map_or(bytes.len(), |end| i + end + 1);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = skip_block_comment(bytes, i),
            b'$' if !previous_is_ident && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                // A parameter the client numbered itself: PostgreSQL reads `$` and its digits.
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let number = sql[i + 1..i + 1 + digits]
                    .parse::<usize>()
                    .unwrap_or(usize::MAX);
                written = written.max(number);
                i += 1 + digits;
            }
            b'$' if !previous_is_ident => i = skip_dollar_quoted(bytes, i),
            b'?' if bytes.get(i + 1) == Some(&b'?') => {
                out.push_str(&sql[copied..=i]);
                i += 2;
                copied = i;
            }
            b'?' => {
                out.push_str(&sql[copied..i]);
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let number = if digits > 0 {
                    // Digits are ASCII; a number too large for usize is passed on as it is
                    // written, and `check_bound` refuses it.
                    let text = &sql[i + 1..i + 1 + digits];
                    match text.parse::<usize>() {
                        Ok(n) => n,
                        Err(_) => {
                            out.push('$');
                            out.push_str(text);
                            written = usize::MAX;
                            i += 1 + digits;
                            copied = i;
                            continue;
                        }
                    }
                } else {
                    params + 1
                };
                params = params.max(number);
                out.push('$');
                out.push_str(&number.to_string());
                i += 1 + digits;
                copied = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[copied..]);
    Rewritten {
        sql: out,
        params: params.max(written),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(text: &str) -> String {
        rewrite(text).sql
    }

    #[test]
    fn bare_placeholders_are_numbered_in_order() {
        assert_eq!(
            rewrite("SELECT ?, ? FROM t WHERE a = ?"),
            Rewritten {
                sql: "SELECT $1, $2 FROM t WHERE a = $3".into(),
                params: 3
            }
        );
        assert_eq!(rewrite("SELECT 1").params, 0);
        assert_eq!(
            sql("INSERT INTO t VALUES(?,?)"),
            "INSERT INTO t VALUES($1,$2)"
        );
    }

    #[test]
    fn numbered_placeholders_follow_sqlite() {
        assert_eq!(
            rewrite("SELECT ?2, ?, ?1"),
            Rewritten {
                sql: "SELECT $2, $3, $1".into(),
                params: 3
            }
        );
        assert_eq!(sql("SELECT ?10"), "SELECT $10");
    }

    #[test]
    fn literals_identifiers_and_comments_are_untouched() {
        for text in [
            "SELECT '?'",
            "SELECT 'it''s ?'",
            "SELECT E'\\'?'",
            "SELECT e'\\\\' || '?'",
            "SELECT \"a?\"\"b\"",
            "SELECT 1 -- what?\n",
            "SELECT /* ? /* ? */ ? */ 1",
            "SELECT $$ ? $$",
            "SELECT $fn$ ? $$ ? $fn$",
            "SELECT U&'?'",
            "SELECT X'3F'",
        ] {
            assert_eq!(rewrite(text).params, 0, "{text}");
            assert_eq!(sql(text), text);
        }
    }

    #[test]
    fn placeholders_around_literals_are_rewritten() {
        assert_eq!(sql("SELECT '?', ?, \"?\""), "SELECT '?', $1, \"?\"");
        assert_eq!(sql("SELECT E'\\'', ?"), "SELECT E'\\'', $1");
        // Without the E prefix a backslash is an ordinary character.
        assert_eq!(sql("SELECT '\\', ?"), "SELECT '\\', $1");
        // `xE'` is an identifier followed by a literal, not an escape string.
        assert_eq!(sql("SELECT xE'\\', ?"), "SELECT xE'\\', $1");
        assert_eq!(sql("SELECT 1 -- ?\n, ?"), "SELECT 1 -- ?\n, $1");
        assert_eq!(sql("SELECT /* /* */ ? */ ?"), "SELECT /* /* */ ? */ $1");
        assert_eq!(sql("SELECT $a$ ? $a$, ?"), "SELECT $a$ ? $a$, $1");
        assert_eq!(sql("SELECT $$?$$||?"), "SELECT $$?$$||$1");
    }

    #[test]
    fn dollars_that_open_no_body() {
        // A `$` inside an identifier, a positional parameter, a tag that is not closed.
        assert_eq!(sql("SELECT a$b$, ?"), "SELECT a$b$, $1");
        assert_eq!(sql("SELECT $1, ?"), "SELECT $1, $1");
        assert_eq!(sql("SELECT $x, ?"), "SELECT $x, $1");
    }

    #[test]
    fn numbers_past_the_bound_are_refused() {
        assert_eq!(rewrite("SELECT $536870911::int").params, 536_870_911);
        assert_eq!(rewrite("SELECT ?268435455").params, 268_435_455);
        assert_eq!(
            rewrite("SELECT $99999999999999999999999").params,
            usize::MAX
        );
        assert_eq!(
            rewrite("SELECT ?99999999999999999999999").params,
            usize::MAX
        );
        assert_eq!(rewrite("SELECT '$9', $$ $9 $$, a$9").params, 0);
        assert!(rewrite("SELECT $2").check_bound(2).is_ok());
        assert!(rewrite("SELECT $1, ?").check_bound(1).is_ok());
        let err = rewrite("SELECT $3").check_bound(2).unwrap_err();
        assert!(err.message.contains("$3"), "{}", err.message);
        assert!(rewrite("SELECT $65536").check_bound(70_000).is_err());
        assert!(
            rewrite("SELECT $99999999999999999999999")
                .check_bound(3)
                .is_err()
        );
    }

    #[test]
    fn doubled_question_marks_are_operators() {
        assert_eq!(
            rewrite("SELECT doc ?? 'k', doc ??| ?"),
            Rewritten {
                sql: "SELECT doc ? 'k', doc ?| $1".into(),
                params: 1
            }
        );
    }

    #[test]
    fn unterminated_text_is_copied() {
        for text in [
            "SELECT '?",
            "SELECT \"?",
            "SELECT /* ?",
            "SELECT $$ ?",
            "SELECT E'\\",
        ] {
            assert_eq!(sql(text), text);
        }
        assert_eq!(
            sql("SELECT ?99999999999999999999999"),
            "SELECT $99999999999999999999999"
        );
    }

    /// A piece of SQL that holds `?` characters that are not placeholders.
    fn opaque() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let body = "[a-z ?'\"$*/\\\\-]{0,8}";
        prop_oneof![
            "[a-z_][a-z0-9_]{0,6}",
            body.prop_map(|b| format!("'{}'", b.replace('\'', "''"))),
            body.prop_map(|b| format!("E'{}'", b.replace('\\', "\\\\").replace('\'', "\\'"))),
            body.prop_map(|b| format!("\"{}\"", b.replace('"', "\"\""))),
            "[a-z ?'\"$*/]{0,8}".prop_map(|b| format!("-- {b}\n")),
            "[a-z ?'\"$]{0,8}".prop_map(|b| format!("/* {b} /* {b} */ */")),
            "[a-z ?'\"*/-]{0,8}".prop_map(|b| format!("$${b}$$")),
            "[a-z ?'\"*/-]{0,8}".prop_map(|b| format!("$q1${b}$q1$")),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Placeholders between opaque pieces are numbered in order; the pieces are kept.
        #[test]
        fn only_bare_placeholders_are_rewritten(
            pieces in proptest::collection::vec((opaque(), proptest::bool::ANY), 0..24)
        ) {
            let mut text = String::new();
            let mut expected = String::new();
            let mut n = 0;
            for (piece, placeholder) in &pieces {
                text.push_str(piece);
                expected.push_str(piece);
                text.push(' ');
                expected.push(' ');
                if *placeholder {
                    n += 1;
                    text.push_str("? ");
                    expected.push_str(&format!("${n} "));
                }
            }
            let got = rewrite(&text);
            proptest::prop_assert_eq!(got.sql, expected);
            proptest::prop_assert_eq!(got.params, n);
        }

        /// Whatever the text, the lexer answers without panicking, and only `?` change.
        #[test]
        fn any_text_is_rewritten_without_panic(text in "[a-zE?'\"$*/\\\\\n-]{0,64}") {
            let got = rewrite(&text);
            let without = |s: &str| s.chars().filter(|c| !matches!(c, '?' | '$') && !c.is_ascii_digit()).collect::<String>();
            proptest::prop_assert_eq!(without(&got.sql), without(&text));
        }
    }
}
