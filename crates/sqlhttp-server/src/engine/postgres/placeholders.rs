//! Rewriting the protocol's `?` placeholders into PostgreSQL's `$1..$n`.
//!
//! A small lexer walks the SQL text once and rewrites only the `?` that stand where a value
//! may: it copies string literals (`'..'` with `''`, `E'..'` with backslash escapes), quoted
//! identifiers (`".."`), line comments (`--`), nested block comments (`/* /* */ */`) and
//! dollar-quoted bodies (`$$..$$`, `$tag$..$tag$`) untouched. `?NNN` (SQLite's numbered form)
//! becomes `$NNN`; a bare `?` takes the number after the largest so far, as in SQLite. `??` is an
//! escaped `?`, for PostgreSQL's operators that contain one (`jsonb ?? 'key'` sends `jsonb ? 'key'`).
//!
//! Pure text in, text out: knows PostgreSQL's lexical rules, nothing about connections or HTTP.
//! Unterminated literals and comments are copied as they are; PostgreSQL reports them.

/// The SQL text with `$n` placeholders, and how many parameters it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rewritten {
    /// The text for PostgreSQL.
    pub(crate) sql: String,
    /// The largest placeholder number used (0 when there is none).
    pub(crate) params: usize,
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn is_ident_char(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit() || c == b'$'
}

/// Rewrites `sql`'s placeholders (see the module documentation).
pub(crate) fn rewrite(sql: &str) -> Rewritten {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut params = 0usize;
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
                    // written, and PostgreSQL refuses it.
                    let text = &sql[i + 1..i + 1 + digits];
                    match text.parse::<usize>() {
                        Ok(n) => n,
                        Err(_) => {
                            out.push('$');
                            out.push_str(text);
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
    Rewritten { sql: out, params }
}

/// The index after the closing `quote` of a literal whose body starts at `i`; a doubled quote
/// is part of the body, and so is a backslash-escaped character when `escapes`.
fn skip_quoted(bytes: &[u8], mut i: usize, quote: u8, escapes: bool) -> usize {
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if escapes => i += 2,
            c if c == quote => {
                if bytes.get(i + 1) == Some(&quote) {
                    i += 2;
                } else {
                    return i + 1;
                }
            }
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The index after a block comment starting at `i` (`/*`), nested comments included.
fn skip_block_comment(bytes: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < bytes.len() {
        if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'*') {
            depth += 1;
            i += 2;
        } else if bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    bytes.len()
}

/// At a `$` not inside an identifier: the index after a dollar-quoted body (`$tag$..$tag$`)
/// when one starts here, else just past the `$` (a `$1` parameter or an operator).
fn skip_dollar_quoted(bytes: &[u8], i: usize) -> usize {
    let tag_len = match bytes.get(i + 1) {
        Some(b'$') => 0,
        Some(&c) if is_ident_start(c) => {
            let len = bytes[i + 1..]
                .iter()
                .take_while(|&&b| is_ident_char(b) && b != b'$')
                .count();
            if bytes.get(i + 1 + len) != Some(&b'$') {
                return i + 1;
            }
            len
        }
        _ => return i + 1,
    };
    let delimiter = &bytes[i..i + tag_len + 2];
    let body = i + tag_len + 2;
    bytes[body..]
        .windows(delimiter.len())
        .position(|window| window == delimiter)
        .map_or(bytes.len(), |at| body + at + delimiter.len())
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
