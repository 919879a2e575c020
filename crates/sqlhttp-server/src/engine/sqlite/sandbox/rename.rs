//! The one name SQLite's authorizer is not told: the new name of `ALTER TABLE ... RENAME TO`,
//! read from the statement's text as SQLite tokenizes it ([`check_new_names`]).
//!
//! Text only; nothing here compiles or runs a statement.

use crate::protocol::error::ApiError;

use super::rules::{is_server_object, reserved};

/// Refuses, on SQLite, an `ALTER TABLE ... RENAME TO` whose new name is in the server's
/// namespace: SQLite's authorizer is told the old name only. An early, clear answer; what the
/// statement does to the schema is checked after it ran ([`SchemaRows`](super::schema::SchemaRows)) whatever its text.
pub(crate) fn check_new_names(sql: &str) -> Result<(), ApiError> {
    match renamed_to(sql) {
        Some(name) if is_server_object(&name) => Err(ApiError::not_allowed(reserved(&name))),
        _ => Ok(()),
    }
}

/// The new name of an `ALTER TABLE [schema.]table RENAME TO name` (dequoted), read as SQLite
/// reads the text; `None` for any other statement (`RENAME [COLUMN] a TO b` included).
pub(super) fn renamed_to(sql: &str) -> Option<String> {
    let mut tokens = Tokens(sql);
    let word = |token: Option<Token>, keyword: &str| match token {
        Some(Token::Word(word)) if word.eq_ignore_ascii_case(keyword) => Some(()),
        _ => None,
    };
    let name = |token: Option<Token>| match token {
        Some(Token::Word(name) | Token::Quoted(name)) => Some(name),
        _ => None,
    };
    word(tokens.next(), "ALTER")?;
    word(tokens.next(), "TABLE")?;
    name(tokens.next())?;
    let mut next = tokens.next();
    if next == Some(Token::Dot) {
        name(tokens.next())?;
        next = tokens.next();
    }
    word(next, "RENAME")?;
    word(tokens.next(), "TO")?;
    name(tokens.next())
}

/// A token of SQLite's text, as far as [`renamed_to`] needs one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Token {
    /// A bare word: a keyword or a name.
    Word(String),
    /// A quoted name or string, without its quotes (`"x"`, `` `x` ``, `[x]`, `'x'`).
    Quoted(String),
    Dot,
    /// Anything else (one character).
    Other,
}

/// SQLite's tokens, comments and white space skipped (block comments do not nest in SQLite).
pub(super) struct Tokens<'a>(&'a str);

impl Iterator for Tokens<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        loop {
            let rest = self.0.trim_start_matches(|c: char| c.is_ascii_whitespace());
            if let Some(comment) = rest.strip_prefix("--") {
                self.0 = comment.find('\n').map_or("", |end| &comment[end..]);
            } else if let Some(comment) = rest.strip_prefix("/*") {
                self.0 = comment.find("*/").map_or("", |end| &comment[end + 2..]);
            } else {
                self.0 = rest;
                break;
            }
        }
        let first = self.0.chars().next()?;
        let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$' || !c.is_ascii();
        let (token, len) = match first {
            '"' | '`' | '\'' => quoted(self.0, first, first),
            '[' => quoted(self.0, '[', ']'),
            '.' => (Token::Dot, 1),
            c if is_word(c) => {
                let end = self.0.find(|c: char| !is_word(c)).unwrap_or(self.0.len());
                (Token::Word(self.0[..end].to_owned()), end)
            }
            c => (Token::Other, c.len_utf8()),
        };
        self.0 = &self.0[len..];
        Some(token)
    }
}

/// The quoted token at the start of `text` (opened by `open`, closed by `close`, which is
/// doubled to stand for itself, except in `[...]`) and its length in bytes.
pub(super) fn quoted(text: &str, open: char, close: char) -> (Token, usize) {
    let mut name = String::new();
    let mut chars = text.char_indices().skip(1).peekable();
    while let Some((at, c)) = chars.next() {
        if c == close {
            if open != '[' && chars.peek().is_some_and(|(_, next)| *next == close) {
                chars.next();
                name.push(close);
                continue;
            }
            return (Token::Quoted(name), at + c.len_utf8());
        }
        name.push(c);
    }
    // Unterminated: SQLite refuses the text.
    (Token::Other, text.len())
}
