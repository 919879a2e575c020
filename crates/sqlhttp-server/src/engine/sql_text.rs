//! The one lexer for client SQL text: the statement an engine runs and its first keywords, read
//! the way each engine reads them (ADR 0027).
//!
//! Both engines drop empty statements: PostgreSQL's parser skips a `;` with nothing before it
//! (`;COMMIT` is a COMMIT), and SQLite's prepare (rusqlite's `Batch`) skips them too. So a
//! statement's first keyword is the first word after whitespace, comments *and* semicolons,
//! and each engine's notion of those differs:
//!
//! | | whitespace | `--` ends at | `/* */` |
//! |---|---|---|---|
//! | SQLite (`tokenize.c`) | space, `\t`, `\n`, `\f`, `\r` | `\n` | unnested |
//! | PostgreSQL (`scan.l`) | space, `\t`, `\n`, `\r`, `\f` (and `\v` from 16) | `\n` or `\r` | nested |
//!
//! Nothing else is whitespace to either (Rust's `trim_start` is Unicode's: a no-break space is
//! an identifier character to both engines). A check that refuses a keyword looks at every
//! statement under both readings ([`readings`]) and refuses when either finds it: refusing
//! more than an engine would run is safe, missing what it runs is not.
//!
//! The literal skippers ([`skip_quoted`], [`skip_block_comment`], [`skip_dollar_quoted`]) are the
//! ones PostgreSQL's placeholder rewriter uses. Pure text in, words out: knows the two engines'
//! lexical rules, nothing about what a check refuses, connections or HTTP.

/// Whose lexical rules a reading follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// Whitespace as the engine's tokenizer counts it. PostgreSQL 16 added `\v`; counting it
    /// on 15 too only finds a keyword that 15 refuses as a syntax error.
    fn is_space(self, byte: u8) -> bool {
        match self {
            Dialect::Sqlite => matches!(byte, b' ' | b'\t' | b'\n' | b'\x0c' | b'\r'),
            Dialect::Postgres => matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' | b'\x0b'),
        }
    }

    fn ends_line_comment(self, byte: u8) -> bool {
        match self {
            Dialect::Sqlite => byte == b'\n',
            Dialect::Postgres => byte == b'\n' || byte == b'\r',
        }
    }
}

/// One non-empty statement of a text, as one dialect reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statement {
    /// Its first word, ASCII-uppercased ("" when it starts with something else: `(`, a string).
    pub(crate) first: String,
    /// The word after it ("" when none follows directly).
    pub(crate) second: String,
}

/// The statement `dialect`'s engine runs: the first non-empty one, after whitespace, comments
/// and empty statements (`;`); `None` when there is none. Both engines refuse a text with a
/// second statement (SQLite's prepare through rusqlite's `Batch`: `MultipleStatement`;
/// PostgreSQL's Parse: `42601 cannot insert multiple commands`), so the first is the only one
/// that runs, and the text after it is not read: a trigger's or a `BEGIN ATOMIC` function's
/// body holds `;` and words such as `END` that are not statements.
pub(crate) fn statement(sql: &str, dialect: Dialect) -> Option<Statement> {
    let bytes = sql.as_bytes();
    let at = skip_trivia(bytes, 0, dialect, true);
    if at >= bytes.len() {
        return None;
    }
    let (first, after_first) = word(sql, at);
    let second = if first.is_empty() {
        String::new()
    } else {
        word(sql, skip_trivia(bytes, after_first, dialect, false)).0
    };
    Some(Statement { first, second })
}

/// The statement each engine runs ([`statement`]), under both readings: SQLite's, then
/// PostgreSQL's.
pub(crate) fn readings(sql: &str) -> impl Iterator<Item = Statement> {
    [Dialect::Sqlite, Dialect::Postgres]
        .into_iter()
        .filter_map(|dialect| statement(sql, dialect))
}

/// The first keyword of the statement each engine runs, under both readings ("" for none).
pub(crate) fn first_keywords(sql: &str) -> [String; 2] {
    [Dialect::Sqlite, Dialect::Postgres].map(|dialect| {
        statement(sql, dialect)
            .map(|statement| statement.first)
            .unwrap_or_default()
    })
}

/// The first entry of `refused` that the statement starts with, under either reading. Reads
/// only the first word of each, in place (no copy): it runs on every request's text.
pub(crate) fn leading<'k>(sql: &str, refused: &[&'k str]) -> Option<&'k str> {
    [Dialect::Sqlite, Dialect::Postgres]
        .into_iter()
        .find_map(|dialect| {
            let first = first_word(sql, dialect)?;
            refused
                .iter()
                .copied()
                .find(|keyword| keyword.eq_ignore_ascii_case(first))
        })
}

/// The first word of the statement `dialect`'s engine runs, as written ([`statement`]'s
/// `first` before it is uppercased); `None` when there is no statement or it starts with
/// something else than a word.
fn first_word(sql: &str, dialect: Dialect) -> Option<&str> {
    let at = skip_trivia(sql.as_bytes(), 0, dialect, true);
    let end = word_end(sql.as_bytes(), at);
    // `at` and `end` are on character boundaries (see `word`).
    (end > at).then(|| &sql[at..end])
}

/// The keywords that start a statement that controls a transaction: every request is its own
/// transaction, so the sandbox refuses these.
pub(crate) const TRANSACTION_CONTROL: [&str; 6] =
    ["BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"];

/// Whether the statement is an INSERT, REPLACE, UPDATE, DELETE or MERGE (or a WITH prefix
/// before one) under either reading: the only statements whose `rows_affected` is the engine's
/// change count. DDL that changes rows as a side effect (`DROP TABLE` under `ON DELETE
/// CASCADE`) reports 0.
pub(crate) fn may_change_rows(sql: &str) -> bool {
    first_keywords(sql).iter().any(|keyword| {
        matches!(
            keyword.as_str(),
            "INSERT" | "REPLACE" | "UPDATE" | "DELETE" | "MERGE" | "WITH"
        )
    })
}

/// Whether the statement may insert rows itself (INSERT, REPLACE, or a WITH prefix before one).
pub(crate) fn may_insert(sql: &str) -> bool {
    first_keywords(sql)
        .iter()
        .any(|keyword| matches!(keyword.as_str(), "INSERT" | "REPLACE" | "WITH"))
}

/// A byte that may start an identifier (both engines: ASCII letters, `_`, any non-ASCII byte).
pub(crate) fn is_ident_start(byte: u8) -> bool {
    byte.is_ascii_alphabetic() || byte == b'_' || byte >= 0x80
}

/// A byte that may continue an identifier (both engines count `$` and digits too).
pub(crate) fn is_ident_char(byte: u8) -> bool {
    is_ident_start(byte) || byte.is_ascii_digit() || byte == b'$'
}

/// The word starting at `at` (uppercased; "" when none starts there) and the index after it.
fn word(sql: &str, at: usize) -> (String, usize) {
    let end = word_end(sql.as_bytes(), at);
    // `at` and `end` are on character boundaries: identifier runs end at ASCII bytes or at the
    // end of the text, and non-ASCII bytes are all inside the run.
    (sql[at..end].to_ascii_uppercase(), end)
}

/// The index after the identifier that starts at `at` (`at` itself when none does).
fn word_end(bytes: &[u8], at: usize) -> usize {
    if !bytes.get(at).is_some_and(|&b| is_ident_start(b)) {
        return at;
    }
    at + bytes[at..]
        .iter()
        .take_while(|&&b| is_ident_char(b))
        .count()
}

/// The index after whitespace and comments from `at` (and `;` too when `semicolons`).
pub(crate) fn skip_trivia(
    bytes: &[u8],
    mut at: usize,
    dialect: Dialect,
    semicolons: bool,
) -> usize {
    while let Some(&byte) = bytes.get(at) {
        if dialect.is_space(byte) || (semicolons && byte == b';') {
            at += 1;
        } else if byte == b'-' && bytes.get(at + 1) == Some(&b'-') {
            at = line_comment_end(bytes, at, dialect);
        } else if byte == b'/' && bytes.get(at + 1) == Some(&b'*') {
            at = match dialect {
                Dialect::Postgres => skip_block_comment(bytes, at),
                Dialect::Sqlite => unnested_comment_end(bytes, at),
            };
        } else {
            break;
        }
    }
    at
}

fn line_comment_end(bytes: &[u8], at: usize, dialect: Dialect) -> usize {
    bytes[at..]
        .iter()
        .position(|&b| dialect.ends_line_comment(b))
        .map_or(bytes.len(), |end| at + end + 1)
}

/// The index after an unnested block comment starting at `at` (SQLite's reading).
fn unnested_comment_end(bytes: &[u8], at: usize) -> usize {
    bytes[at + 2..]
        .windows(2)
        .position(|pair| pair == b"*/")
        .map_or(bytes.len(), |end| at + 2 + end + 2)
}

/// The index after the closing `quote` of a literal whose body starts at `i`; a doubled quote
/// is part of the body, and so is a backslash-escaped character when `escapes`.
pub(crate) fn skip_quoted(bytes: &[u8], mut i: usize, quote: u8, escapes: bool) -> usize {
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

/// The index after a block comment starting at `i` (`/*`), nested comments included, as
/// PostgreSQL reads them.
pub(crate) fn skip_block_comment(bytes: &[u8], mut i: usize) -> usize {
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
pub(crate) fn skip_dollar_quoted(bytes: &[u8], i: usize) -> usize {
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

    fn is_transaction_control(sql: &str) -> bool {
        leading(sql, &TRANSACTION_CONTROL).is_some()
    }

    fn firsts(sql: &str, dialect: Dialect) -> Vec<String> {
        statement(sql, dialect)
            .into_iter()
            .map(|statement| statement.first)
            .collect()
    }

    #[test]
    fn empty_statements_are_skipped() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            assert_eq!(firsts(";COMMIT", dialect), ["COMMIT"]);
            assert_eq!(firsts(" ; ;\n;begin read write", dialect), ["BEGIN"]);
            assert_eq!(firsts("/* x */;-- y\n;SAVEPOINT a", dialect), ["SAVEPOINT"]);
            assert_eq!(firsts("SELECT 1;;COMMIT;", dialect), ["SELECT"]);
            assert_eq!(firsts(";;  ;", dialect), Vec::<String>::new());
        }
        assert!(is_transaction_control(";COMMIT"));
        // A trigger's body is not a statement of its own.
        assert!(!is_transaction_control(
            "CREATE TRIGGER t AFTER INSERT ON b BEGIN SELECT 1; END"
        ));
        assert_eq!(leading(";SET x = 1", &["SET"]), Some("SET"));
    }

    #[test]
    fn whitespace_is_each_engines_own() {
        // A vertical tab is whitespace to PostgreSQL 16, an illegal character to SQLite.
        assert_eq!(firsts("\x0bCOMMIT", Dialect::Postgres), ["COMMIT"]);
        assert_eq!(firsts("\x0bCOMMIT", Dialect::Sqlite), [""]);
        // A no-break space is an identifier character to both.
        assert_eq!(
            firsts("\u{a0}COMMIT", Dialect::Postgres),
            ["\u{a0}COMMIT".to_ascii_uppercase()]
        );
        assert_eq!(firsts("\x0c\r\t COMMIT", Dialect::Sqlite), ["COMMIT"]);
    }

    #[test]
    fn comments_are_each_engines_own() {
        // SQLite ends a line comment at a newline only; PostgreSQL at a carriage return too.
        assert_eq!(
            firsts("-- x\rCOMMIT\nSELECT 1", Dialect::Postgres),
            ["COMMIT"]
        );
        assert_eq!(
            firsts("-- x\rCOMMIT\nSELECT 1", Dialect::Sqlite),
            ["SELECT"]
        );
        assert_eq!(
            firsts("/* /* */ x */ COMMIT", Dialect::Postgres),
            ["COMMIT"]
        );
        assert_eq!(firsts("/* /* */ x */ COMMIT", Dialect::Sqlite)[0], "X");
        assert_eq!(firsts("/* /* */ COMMIT", Dialect::Sqlite), ["COMMIT"]);
        assert_eq!(
            firsts("/* /* */ COMMIT", Dialect::Postgres),
            Vec::<String>::new()
        );
        assert_eq!(
            firsts("/* unterminated", Dialect::Sqlite),
            Vec::<String>::new()
        );
        assert!(is_transaction_control("/* /* */ x */ COMMIT"));
        assert!(is_transaction_control("/* /* */ COMMIT"));
        assert!(is_transaction_control("-- x\rCOMMIT"));
        assert!(is_transaction_control("-- x\r;\nCOMMIT"));
        assert!(is_transaction_control("-- x\n;\rCOMMIT"));
    }

    #[test]
    fn words_are_whole_identifiers() {
        assert!(!is_transaction_control("commit1"));
        assert!(!is_transaction_control("begin$x"));
        assert!(!is_transaction_control("SELECT 'BEGIN'"));
        assert!(is_transaction_control("END TRANSACTION"));
        assert_eq!(
            statement(";alter /* x */ role me", Dialect::Postgres),
            Some(Statement {
                first: "ALTER".into(),
                second: "ROLE".into()
            })
        );
        assert!(may_insert(";replace into t values (1)"));
        assert!(may_insert(
            "WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x"
        ));
        assert!(!may_insert("UPDATE t SET a = 1"));
        assert!(may_change_rows(";delete from t"));
        assert!(!may_change_rows("DROP TABLE t"));
        assert!(!may_change_rows("SELECT 1"));
    }

    /// What a reader of `prefix` (pieces of whitespace, comments and `;` that both engines
    /// skip) must find next.
    fn trivia() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just(";".to_owned()),
            Just(" ".to_owned()),
            Just("\t".to_owned()),
            Just("\n".to_owned()),
            Just("\r\n".to_owned()),
            Just("\x0c".to_owned()),
            "[a-z ;']{0,6}".prop_map(|c| format!("-- {c}\n")),
            "[a-z ;'-]{0,6}".prop_map(|c| format!("/* {c} */")),
        ]
    }

    proptest::proptest! {
        /// The in-place first word `leading` compares is the word `statement` reads, on any
        /// text of trivia, words and the bytes either engine treats specially.
        #[test]
        fn the_first_word_read_in_place_is_the_statements(
            prefix in proptest::collection::vec(trivia(), 0..6),
            rest in "[a-zA-Z_0-9$é ;(/*'\\-]{0,12}",
        ) {
            let sql = format!("{}{rest}", prefix.concat());
            for dialect in [Dialect::Sqlite, Dialect::Postgres] {
                let read = statement(&sql, dialect)
                    .map(|statement| statement.first)
                    .filter(|first| !first.is_empty());
                proptest::prop_assert_eq!(
                    first_word(&sql, dialect).map(str::to_ascii_uppercase),
                    read
                );
            }
        }

        /// Whatever trivia both engines skip comes before a keyword, both readings find it.
        #[test]
        fn the_keyword_after_any_trivia_is_found(
            prefix in proptest::collection::vec(trivia(), 0..12),
            keyword in "(COMMIT|BEGIN|SET|SELECT|copy|Lock)",
        ) {
            let sql = format!("{} {keyword} x", prefix.concat());
            let upper = keyword.to_ascii_uppercase();
            proptest::prop_assert_eq!(first_keywords(&sql), [upper.clone(), upper]);
        }

        #[test]
        fn any_text_is_read_without_panic(sql in "\\PC{0,80}") {
            let _ = readings(&sql).count();
            let _ = first_keywords(&sql);
        }

        #[test]
        fn any_bytes_of_sql_are_read_without_panic(sql in "[a-z;'\"$`\\[\\]*/ \r\n\x0b-]{0,64}") {
            let _ = readings(&sql).count();
        }
    }
}
