//! SQL scripts cut into statements: [`split`] finds where each statement of a script ends (a `;`
//! outside quotes, comments, dollar-quoted bodies and `BEGIN ... END` blocks) and the line it
//! starts on, for the CLI's shell and batch files and for [`Migrator`](crate::migrate::Migrator)'s
//! files.
//!
//! **Not part of the API**: `#[doc(hidden)]`, public only for this workspace's CLI and testkit,
//! and it may change in any release (ADR 0049).
//!
//! Pure text handling: it knows the quoting rules of SQLite and PostgreSQL, and nothing about
//! servers or about what a statement does (whether it writes is the server's to say).

/// One complete statement of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScriptStatement {
    /// The statement's text from its first token, without its `;` and the whitespace before
    /// that (comments and whitespace before its first token are left out; those inside it stay).
    pub sql: String,
    /// The line (1-based, in the text given to [`split`]) of the statement's first token, after
    /// any comments before it.
    pub line: usize,
}

/// A script cut into statements by [`split`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Split<'a> {
    /// The complete statements, in order; statements that are empty (`;;`) or only comments are
    /// left out.
    pub statements: Vec<ScriptStatement>,
    /// What follows the last `;`: an incomplete statement (a shell waits for more input), or
    /// whitespace and comments only.
    pub rest: &'a str,
    /// The line (1-based) `rest` starts on.
    pub rest_line: usize,
    /// Whether the text ends inside a quote, a block comment, a dollar-quoted body or a
    /// `BEGIN ... END` body: `rest` cannot be a whole statement yet.
    pub rest_is_open: bool,
}

impl Split<'_> {
    /// Whether `rest` holds a statement, not only whitespace and comments.
    pub fn rest_is_statement(&self) -> bool {
        first_token(self.rest.as_bytes(), 0).is_some()
    }

    /// `rest` as the script's last statement, for scripts whose last statement may omit its
    /// `;`: `None` when `rest` holds no statement, `Err` with the line it starts on when it is
    /// not closed (a quote, comment or body runs to the end of the text).
    pub fn last_statement(&self) -> Option<Result<ScriptStatement, usize>> {
        let first = first_token(self.rest.as_bytes(), 0)?;
        let line = self.rest_line + count_lines(&self.rest.as_bytes()[..first]);
        Some(if self.rest_is_open {
            Err(line)
        } else {
            Ok(ScriptStatement {
                sql: self.rest[first..].trim_end().to_owned(),
                line,
            })
        })
    }
}

/// Cuts `text` into the complete statements it holds, each ended by a `;` that is outside
/// quotes and comments.
///
/// What it knows: `'...'` strings (`''` inside), `E'...'` strings with backslash escapes,
/// `"..."` and `` `...` `` identifiers, SQLite's `[...]` identifiers (a `[` whose `]` comes
/// before any quote or line break; otherwise a PostgreSQL array bracket), `$$ ... $$` and
/// `$tag$ ... $tag$` bodies, `--` comments and `/* */` comments, which nest as PostgreSQL
/// nests them (on SQLite a nested `/*` is a syntax error after the first `*/` anyway, so
/// nothing PostgreSQL would skip is ever run), parentheses (a `;` inside them, as in a
/// PostgreSQL rule's `DO (...; ...)`, does not end the statement), and the bodies of
/// `CREATE [TEMP] TRIGGER ... BEGIN ... END` and `CREATE [OR REPLACE] FUNCTION/PROCEDURE ...
/// BEGIN ATOMIC ... END`, inside which `;` ends the body's statements (a `CASE ... END` in such
/// a body is counted, so its `END` does not end the body). A UTF-8 byte order mark at the start
/// is skipped. Unterminated quotes and comments run to the end of the text, which then is
/// `rest`.
///
/// ```
/// let script = "CREATE TABLE t (x TEXT); -- one\nINSERT INTO t VALUES ('a;b');\nSELECT";
/// let split = sqlhttp::script::split(script);
/// assert_eq!(split.statements.len(), 2);
/// assert_eq!(split.statements[1].sql, "INSERT INTO t VALUES ('a;b')");
/// assert_eq!(split.statements[1].line, 2);
/// assert_eq!(split.rest.trim(), "SELECT");
/// ```
pub fn split(text: &str) -> Split<'_> {
    let bytes = text.as_bytes();
    let mut statements = Vec::new();
    // A byte order mark is no part of a statement (PostgreSQL would fail on it).
    let mut start = if text.starts_with('\u{feff}') { 3 } else { 0 };
    let mut start_line = 1;
    let mut line = 1;
    let mut i = start;
    let mut block = Block::default();
    let mut parens = 0_usize;
    // Whether the text ends inside a quote, a comment or a dollar-quoted body.
    let mut unterminated = false;
    while i < bytes.len() {
        let b = bytes[i];
        let skipped = match b {
            b'\n' => {
                line += 1;
                Some(i + 1)
            }
            b'\'' => skip_quoted(bytes, i, b'\''),
            b'"' | b'`' => skip_quoted(bytes, i, b),
            b'[' => Some(skip_bracketed(bytes, i)),
            b'(' => {
                parens += 1;
                Some(i + 1)
            }
            b')' => {
                parens = parens.saturating_sub(1);
                Some(i + 1)
            }
            // A line comment may end the text: it is closed by its end.
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                Some(memchr_from(bytes, i, b'\n').unwrap_or(bytes.len()))
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => skip_block_comment(bytes, i),
            b'$' if !follows_word(bytes, i) => match dollar_tag(bytes, i) {
                Some(tag_len) => skip_dollar_quoted(bytes, i, tag_len),
                None => Some(i + 1),
            },
            b'e' | b'E' if bytes.get(i + 1) == Some(&b'\'') && !follows_word(bytes, i) => {
                skip_escaped(bytes, i + 1)
            }
            _ if is_word_byte(b) && !follows_word(bytes, i) => {
                let end = word_end(bytes, i);
                block.word(&text[start..i], &text[i..end], &text[end..]);
                Some(end)
            }
            b';' if block.depth == 0 && parens == 0 => {
                if let Some(first) = first_token(bytes, start).filter(|&first| first < i) {
                    statements.push(ScriptStatement {
                        sql: text[first..i].trim_end().to_owned(),
                        line: start_line + count_lines(&bytes[start..first]),
                    });
                }
                block = Block::default();
                parens = 0;
                start = i + 1;
                start_line = line;
                Some(i + 1)
            }
            _ => Some(i + 1),
        };
        let next = skipped.unwrap_or_else(|| {
            unterminated = true;
            bytes.len()
        });
        // Skipped runs (strings, comments, bodies) may span lines.
        if next > i + 1 {
            line += count_lines(&bytes[i + 1..next.min(bytes.len())]);
        }
        i = next;
    }
    Split {
        statements,
        rest: &text[start..],
        rest_line: start_line,
        rest_is_open: unterminated || block.depth > 0,
    }
}

/// The nesting of `BEGIN ... END` bodies within the statement being read.
#[derive(Debug, Default)]
struct Block {
    depth: usize,
}

impl Block {
    /// Sees `word`, with `before` the statement's text before it and `after` the rest of the
    /// text.
    fn word(&mut self, before: &str, word: &str, after: &str) {
        if self.depth == 0 {
            if word.eq_ignore_ascii_case("BEGIN") && opens_body(before, after) {
                self.depth = 1;
            }
        } else if word.eq_ignore_ascii_case("CASE") {
            self.depth += 1;
        } else if word.eq_ignore_ascii_case("END") {
            self.depth -= 1;
        }
    }
}

/// Whether a `BEGIN` after `before` (and before `after`) opens a body: in `CREATE [TEMP]
/// TRIGGER`, any `BEGIN` (a trigger has no other); in `CREATE [OR REPLACE] FUNCTION` or
/// `PROCEDURE`, `BEGIN ATOMIC` only (a parameter may be called `begin`). The kind is read where
/// `CREATE` puts it, so a table named `procedure` is a table.
fn opens_body(before: &str, after: &str) -> bool {
    let mut words = code_words(before);
    if !words
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("CREATE"))
    {
        return false;
    }
    let mut kind = words.next().unwrap_or_default();
    if kind.eq_ignore_ascii_case("OR") {
        // OR REPLACE
        words.next();
        kind = words.next().unwrap_or_default();
    }
    if kind.eq_ignore_ascii_case("TEMP") || kind.eq_ignore_ascii_case("TEMPORARY") {
        kind = words.next().unwrap_or_default();
    }
    if kind.eq_ignore_ascii_case("TRIGGER") {
        return true;
    }
    (kind.eq_ignore_ascii_case("FUNCTION") || kind.eq_ignore_ascii_case("PROCEDURE"))
        && code_words(after)
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case("ATOMIC"))
}

/// The first `n` words of `sql` outside comments (a keyword or name is a word; any other
/// character is a word of its own), for checks on a statement's leading keywords.
pub(crate) fn leading_words(sql: &str, n: usize) -> impl Iterator<Item = &str> {
    code_words(sql).take(n)
}

/// The words of `text` outside comments (for the first few keywords of a statement).
fn code_words(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = first_token(bytes, i)?;
        let end = if is_word_byte(bytes[first]) {
            word_end(bytes, first)
        } else {
            first + 1
        };
        i = end;
        Some(&text[first..end])
    })
}

/// The index of the first byte at or after `from` that is neither whitespace nor in a comment.
fn first_token(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b if b.is_ascii_whitespace() => i += 1,
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = memchr_from(bytes, i, b'\n')?;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = skip_block_comment(bytes, i)?,
            _ => return Some(i),
        }
    }
    None
}

fn count_lines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

fn memchr_from(bytes: &[u8], from: usize, needle: u8) -> Option<usize> {
    bytes[from..]
        .iter()
        .position(|&b| b == needle)
        .map(|at| from + at)
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// Whether the byte before `i` continues a word (so `$` or `E` at `i` is part of it).
fn follows_word(bytes: &[u8], i: usize) -> bool {
    i > 0 && (is_word_byte(bytes[i - 1]) || bytes[i - 1] == b'$')
}

fn word_end(bytes: &[u8], from: usize) -> usize {
    let mut i = from;
    while i < bytes.len() && (is_word_byte(bytes[i]) || bytes[i] == b'$') {
        i += 1;
    }
    i
}

/// The index after the closing `close` of a quoted run starting at `open` (a doubled closer is
/// an escape); `None` when the text ends first.
fn skip_quoted(bytes: &[u8], open: usize, close: u8) -> Option<usize> {
    let mut i = open + 1;
    while i < bytes.len() {
        if bytes[i] == close {
            if bytes.get(i + 1) == Some(&close) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// The index after a SQLite `[...]` identifier opening at `open`: its `]` must come before any
/// quote or line break. Otherwise the `[` is PostgreSQL's (`ARRAY['a']`, `x[1]`) and only it is
/// passed over.
fn skip_bracketed(bytes: &[u8], open: usize) -> usize {
    for (at, &b) in bytes.iter().enumerate().skip(open + 1) {
        match b {
            b']' => return at + 1,
            b'\'' | b'"' | b'`' | b'\n' | b'[' => break,
            _ => {}
        }
    }
    open + 1
}

/// The index after the `/* ... */` comment opening at `open`, nested comments counted as
/// PostgreSQL counts them; `None` when the text ends first.
fn skip_block_comment(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0_usize;
    let mut i = open;
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// The index after an `E'...'` string whose quote is at `quote`: a backslash escapes the next
/// byte, and `''` is a quote too; `None` when the text ends first.
fn skip_escaped(bytes: &[u8], quote: usize) -> Option<usize> {
    let mut i = quote + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The length of a dollar-quote tag (`$$`, `$body$`) starting at `i`, if one starts there. A tag
/// is PostgreSQL's: letters, digits and `_`, not starting with a digit (so `$1` is a parameter).
fn dollar_tag(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    if bytes.get(j).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    while j < bytes.len() && is_word_byte(bytes[j]) {
        j += 1;
    }
    (bytes.get(j) == Some(&b'$')).then_some(j + 1 - i)
}

/// The index after the closing tag of the dollar-quoted body that opens at `open`; `None` when
/// the text ends first.
fn skip_dollar_quoted(bytes: &[u8], open: usize, tag_len: usize) -> Option<usize> {
    let tag = &bytes[open..open + tag_len];
    let body = open + tag_len;
    bytes[body..]
        .windows(tag_len)
        .position(|window| window == tag)
        .map(|at| body + at + tag_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqls(text: &str) -> Vec<String> {
        split(text).statements.into_iter().map(|s| s.sql).collect()
    }

    #[test]
    fn splits_on_semicolons_outside_quotes_and_comments() {
        let split = split(
            "SELECT 'a;b'; -- c;\nINSERT INTO \"t;\" VALUES (1) /* ; */;\n;  SELECT [x;y] FROM t; SELECT",
        );
        let got: Vec<_> = split.statements.iter().map(|s| s.sql.as_str()).collect();
        assert_eq!(
            got,
            [
                "SELECT 'a;b'",
                "INSERT INTO \"t;\" VALUES (1) /* ; */",
                "SELECT [x;y] FROM t"
            ]
        );
        assert_eq!(
            split.statements[1].line, 2,
            "the line of INSERT, not of the comment"
        );
        assert_eq!(split.rest.trim(), "SELECT");
        assert!(split.rest_is_statement());
        assert_eq!(split.rest_line, 3);
    }

    #[test]
    fn escaped_quotes_and_unterminated_text() {
        assert_eq!(sqls("SELECT 'it''s;'; x"), ["SELECT 'it''s;'"]);
        let open = split("SELECT 'open;");
        assert!(open.statements.is_empty());
        assert_eq!(open.rest, "SELECT 'open;");
        assert_eq!(open.last_statement(), Some(Err(1)));
        let closed = split("SELECT 1;\n\nSELECT 'closed'");
        assert_eq!(closed.last_statement().unwrap().unwrap().line, 3);
        assert!(split("SELECT 1; /* open").rest_is_open);
        assert!(split("CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1;").rest_is_open);
        assert!(!split("SELECT 1; -- closed by the end").rest_is_open);
        assert_eq!(
            sqls("SELECT E'it\\'s;', e'\\\\'; SELECT 2;"),
            ["SELECT E'it\\'s;', e'\\\\'", "SELECT 2"]
        );
        // `name'...'` is not an escape string: only E standing alone.
        assert_eq!(
            sqls("SELECT 'a\\'; SELECT 2;"),
            ["SELECT 'a\\'", "SELECT 2"]
        );
    }

    #[test]
    fn dollar_quoted_bodies_stay_whole() {
        let script = "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\nBEGIN\n  RETURN 1;\nEND;\n$$;\n\
                      CREATE FUNCTION g() RETURNS text AS $body$ SELECT 'x;$$'; $body$ LANGUAGE sql;\n\
                      SELECT $1::int, a$b FROM t;";
        let split = split(script);
        let got: Vec<_> = split.statements.iter().map(|s| s.sql.as_str()).collect();
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got[0].ends_with("END;\n$$"));
        assert!(got[1].ends_with("$body$ LANGUAGE sql"));
        assert_eq!(got[2], "SELECT $1::int, a$b FROM t");
        assert_eq!(
            split.statements.iter().map(|s| s.line).collect::<Vec<_>>(),
            [1, 6, 7]
        );
    }

    #[test]
    fn trigger_and_atomic_bodies_stay_whole() {
        let script = "CREATE TRIGGER tr AFTER INSERT ON t BEGIN\n  UPDATE c SET n = CASE WHEN n > 0 THEN n + 1 ELSE 1 END;\n  DELETE FROM d;\nEND;\nSELECT 1;\n\
                      CREATE OR REPLACE FUNCTION h(a int) RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT a + 1; END;";
        let split = split(script);
        let got: Vec<_> = split.statements.iter().map(|s| s.sql.as_str()).collect();
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got[0].ends_with("END"));
        assert_eq!(got[1], "SELECT 1");
        assert!(got[2].ends_with("SELECT a + 1; END"));
        assert!(split.rest.is_empty());
    }

    #[test]
    fn begin_outside_a_body_is_a_statement() {
        assert_eq!(sqls("BEGIN; SELECT 1; END;"), ["BEGIN", "SELECT 1", "END"]);
        // CASE outside a body does not nest.
        assert_eq!(
            sqls("SELECT CASE WHEN 1 THEN 2 END; SELECT 3;"),
            ["SELECT CASE WHEN 1 THEN 2 END", "SELECT 3"]
        );
    }

    #[test]
    fn what_each_engine_reads_whole() {
        // PostgreSQL's nested comments: nothing inside runs.
        let nested =
            split("/* old:\n /* one-off */ DELETE FROM keep;\n*/\nSELECT count(*) FROM keep;");
        let got: Vec<_> = nested.statements.iter().map(|s| s.sql.as_str()).collect();
        assert_eq!(got, ["SELECT count(*) FROM keep"]);
        assert_eq!(nested.statements[0].line, 4);
        // Array brackets are not identifiers.
        assert_eq!(
            sqls("ALTER TABLE t ADD CHECK (code ~ ANY (ARRAY['^[A-Z]{2}$'])); SELECT x[1] FROM t;"),
            [
                "ALTER TABLE t ADD CHECK (code ~ ANY (ARRAY['^[A-Z]{2}$']))",
                "SELECT x[1] FROM t"
            ]
        );
        // `begin` as a name opens nothing.
        assert_eq!(
            sqls(
                "CREATE FUNCTION span(begin date, finish date) RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql; CREATE TABLE procedure (begin INTEGER, x INTEGER); SELECT 1;"
            ),
            [
                "CREATE FUNCTION span(begin date, finish date) RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql",
                "CREATE TABLE procedure (begin INTEGER, x INTEGER)",
                "SELECT 1"
            ]
        );
        // A rule's actions in parentheses.
        assert_eq!(
            sqls(
                "CREATE RULE r AS ON INSERT TO a DO ALSO (INSERT INTO b VALUES (1); INSERT INTO c VALUES (2)); SELECT 2;"
            ),
            [
                "CREATE RULE r AS ON INSERT TO a DO ALSO (INSERT INTO b VALUES (1); INSERT INTO c VALUES (2))",
                "SELECT 2"
            ]
        );
        // A temporary trigger, and a byte order mark.
        assert_eq!(
            sqls("\u{feff}CREATE TEMP TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END; SELECT 3;"),
            [
                "CREATE TEMP TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END",
                "SELECT 3"
            ]
        );
    }

    #[test]
    fn comments_only_are_no_statement() {
        let split = split("-- header\n/* note; */ ;\n-- trailing");
        assert!(split.statements.is_empty());
        assert!(!split.rest_is_statement());
    }

    #[test]
    fn lines_count_through_strings_and_comments() {
        let split = split("SELECT 'a\nb';\n/* x\ny */ SELECT 2;\n\n\nSELECT 3;");
        assert_eq!(
            split.statements.iter().map(|s| s.line).collect::<Vec<_>>(),
            [1, 4, 7]
        );
    }
}
