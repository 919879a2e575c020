//! Which command tag a statement ends with, read from its text: PostgreSQL names the tag after
//! the statement's main command, the one after any `WITH` list (`WITH t AS (...) SELECT ...`
//! ends `SELECT 3`, `WITH t AS (...) DELETE ...` ends `DELETE 3`). tokio-postgres hands on
//! the tag's row count but not its command, so the command is read here, and `rows_affected` is
//! the tag's count only for `INSERT`, `UPDATE`, `DELETE` and `MERGE` (see
//! `docs/adr/0028-postgresql-answers-and-bounded-cells.md`).
//!
//! Skips whitespace, comments (nested block comments too), empty statements (`;`), string
//! literals, quoted identifiers, dollar-quoted bodies and everything inside parentheses, as
//! PostgreSQL's lexer does. Pure text in, one keyword out; nothing about connections or HTTP.
//! A text this reading gets wrong costs a wrong count, never a check: the sandbox does not
//! read it. The lexical rules (whitespace, comments, literals, dollar quotes) are `sql_text`'s.

use crate::engine::sql_text::{self, Dialect, is_ident_char, is_ident_start};

/// A token of the text, as far as finding the main command needs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A bare word, uppercased.
    Word(String),
    /// A quoted identifier (`"select"`): a name, never a keyword.
    Quoted,
    Open,
    Close,
    Comma,
    /// Anything else: a literal, an operator, a number, `;` inside the text.
    Other,
}

/// The tokens of `sql`, read from the front with the shared lexer's rules (`sql_text`).
struct Lexer<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Lexer<'_> {
    /// The next token at this depth: a parenthesised group is one `Open`, its inside
    /// skipped (iteratively: nesting costs no stack).
    fn next(&mut self, leading: bool) -> Option<Token> {
        let token = self.flat(leading)?;
        if token == Token::Open {
            let mut depth = 1_usize;
            while depth > 0 {
                match self.flat(false)? {
                    Token::Open => depth += 1,
                    Token::Close => depth -= 1,
                    _ => {}
                }
            }
        }
        Some(token)
    }

    /// The next token, each parenthesis on its own.
    fn flat(&mut self, leading: bool) -> Option<Token> {
        self.at = sql_text::skip_trivia(self.bytes, self.at, Dialect::Postgres, leading);
        let c = *self.bytes.get(self.at)?;
        Some(match c {
            b'(' => {
                self.at += 1;
                Token::Open
            }
            b')' => {
                self.at += 1;
                Token::Close
            }
            b',' => {
                self.at += 1;
                Token::Comma
            }
            b'\'' => {
                self.at = sql_text::skip_quoted(self.bytes, self.at + 1, b'\'', false);
                Token::Other
            }
            b'"' => {
                self.at = sql_text::skip_quoted(self.bytes, self.at + 1, b'"', false);
                Token::Quoted
            }
            b'$' => {
                self.at = sql_text::skip_dollar_quoted(self.bytes, self.at);
                Token::Other
            }
            c if is_ident_start(c) => {
                let start = self.at;
                while self.at < self.bytes.len() && is_ident_char(self.bytes[self.at]) {
                    self.at += 1;
                }
                let word = String::from_utf8_lossy(&self.bytes[start..self.at]).to_uppercase();
                // A prefixed literal: E'..' (with escapes), B'..', X'..', U&'..'.
                if self.bytes.get(self.at) == Some(&b'\'') {
                    self.at = sql_text::skip_quoted(self.bytes, self.at + 1, b'\'', word == "E");
                    return Some(Token::Other);
                }
                Token::Word(word)
            }
            _ => {
                self.at += 1;
                Token::Other
            }
        })
    }
}

/// The statement's main command, uppercased: its first keyword, or for a `WITH` statement the
/// keyword after the list of common table expressions ("" when there is none, "(" for a
/// parenthesised query).
pub(crate) fn main_command(sql: &str) -> String {
    let mut lexer = Lexer {
        bytes: sql.as_bytes(),
        at: 0,
    };
    match lexer.next(true) {
        Some(Token::Word(word)) if word == "WITH" => {}
        Some(Token::Word(word)) => return word,
        Some(Token::Open) => return "(".into(),
        _ => return String::new(),
    }
    // WITH [RECURSIVE] name [(columns)] AS [NOT] [MATERIALIZED] (query)
    //      [SEARCH ... | CYCLE ...] [, ...] main
    let mut token = lexer.next(false);
    if token == Some(Token::Word("RECURSIVE".into())) {
        token = lexer.next(false);
    }
    loop {
        // The name (a bare word or a quoted one), its columns, AS, the query.
        let Some(Token::Word(_) | Token::Quoted) = token else {
            return String::new();
        };
        token = lexer.next(false);
        if token == Some(Token::Open) {
            token = lexer.next(false);
        }
        if token != Some(Token::Word("AS".into())) {
            return String::new();
        }
        loop {
            token = lexer.next(false);
            match &token {
                Some(Token::Word(w)) if w == "NOT" || w == "MATERIALIZED" => {}
                Some(Token::Open) => break,
                _ => return String::new(),
            }
        }
        // After the query: `,` and the next one, a SEARCH or CYCLE clause, or the main command.
        token = lexer.next(false);
        loop {
            match token {
                Some(Token::Comma) => break,
                Some(Token::Word(w)) if w == "SEARCH" || w == "CYCLE" => {
                    // Its column lists end at the next `,` or the main command.
                    token = lexer.next(false);
                    while let Some(Token::Word(w)) = &token {
                        if is_command(w) {
                            return w.clone();
                        }
                        token = lexer.next(false);
                    }
                    while !matches!(token, None | Some(Token::Comma | Token::Word(_))) {
                        token = lexer.next(false);
                    }
                    continue;
                }
                Some(Token::Word(w)) => return w,
                Some(Token::Open) => return "(".into(),
                _ => return String::new(),
            }
        }
        token = lexer.next(false);
    }
}

/// A command a `WITH` list may stand before.
fn is_command(word: &str) -> bool {
    matches!(
        word,
        "SELECT" | "INSERT" | "UPDATE" | "DELETE" | "MERGE" | "VALUES" | "TABLE"
    )
}

/// Whether the statement's command tag counts rows it changed (`INSERT 0 3`, `UPDATE 3`,
/// `DELETE 3`, `MERGE 3`): the only tags whose count is `rows_affected`. A `SELECT` tag counts
/// rows returned, and a writable `WITH` before a `SELECT` is not counted by PostgreSQL at all.
pub(crate) fn counts_changed_rows(sql: &str) -> bool {
    matches!(
        main_command(sql).as_str(),
        "INSERT" | "UPDATE" | "DELETE" | "MERGE"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_command_follows_the_with_list() {
        let cases = [
            ("SELECT 1", "SELECT"),
            ("  insert into t values (1)", "INSERT"),
            (";; -- c\n /* a /* b */ */ DELETE FROM t", "DELETE"),
            ("WITH t AS (SELECT 1) SELECT * FROM t", "SELECT"),
            (
                "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) \
                 SELECT n FROM t",
                "SELECT",
            ),
            (
                "WITH d AS (DELETE FROM t RETURNING *) SELECT count(*) FROM d",
                "SELECT",
            ),
            (
                "WITH a AS MATERIALIZED (SELECT ')'), \"b\" AS NOT MATERIALIZED (SELECT $$ ) $$) \
                 UPDATE t SET x = 1",
                "UPDATE",
            ),
            ("WITH insert AS (SELECT 1) SELECT * FROM insert", "SELECT"),
            (
                "WITH s AS (SELECT E'\\') ') INSERT INTO t SELECT 1",
                "INSERT",
            ),
            (
                "WITH RECURSIVE t(id) AS (SELECT 1) SEARCH DEPTH FIRST BY id SET o \
                 DELETE FROM u",
                "DELETE",
            ),
            (
                "WITH RECURSIVE t(id) AS (SELECT 1) CYCLE id SET c USING p, u AS (SELECT 2) \
                 MERGE INTO v USING u ON true WHEN MATCHED THEN DELETE",
                "MERGE",
            ),
            ("WITH t AS (SELECT 1) (SELECT 2)", "("),
            ("(SELECT 1)", "("),
            ("", ""),
            ("WITH", ""),
            ("WITH t AS (SELECT 1", ""),
        ];
        for (sql, command) in cases {
            assert_eq!(main_command(sql), command, "{sql}");
        }
    }

    #[test]
    fn only_changes_are_counted() {
        assert!(counts_changed_rows(
            "WITH t AS (SELECT 1) INSERT INTO u SELECT * FROM t"
        ));
        assert!(counts_changed_rows(
            "MERGE INTO t USING u ON true WHEN MATCHED THEN DELETE"
        ));
        assert!(!counts_changed_rows(
            "WITH t AS (VALUES (1), (2), (3)) SELECT * FROM t"
        ));
        assert!(!counts_changed_rows("CREATE TABLE t AS SELECT 1"));
        assert!(!counts_changed_rows("SELECT 1"));
    }

    #[test]
    fn any_text_has_an_answer() {
        for sql in [
            "$", "$a", "'", "\"", "/*", "--", "(((", ")))", "WITH (", "E'\\",
        ] {
            let _ = main_command(sql);
        }
        let deep = format!("WITH t AS ({}) DELETE FROM t", "(".repeat(300_000));
        assert_eq!(main_command(&deep), "");
        let closed = format!(
            "WITH t AS ({}{}) DELETE FROM t",
            "(".repeat(300_000),
            ")".repeat(300_000)
        );
        assert_eq!(main_command(&closed), "DELETE");
    }
}
