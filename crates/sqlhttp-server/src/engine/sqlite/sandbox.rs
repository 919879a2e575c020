//! SQLite's statement sandbox: every rule a client's statement must pass on SQLite, in one
//! place. It decides on what a statement does, not on how it is spelled (ADR 0023).
//!
//! The rules both engines share (size, NUL, transaction control, `VACUUM`) are
//! `engine::sandbox::check_text`, run once at admission; this module holds what SQLite adds.
//!
//! - [`check_new_names`] adds, on SQLite, the one name SQLite's authorizer is not told: the new
//!   name of `ALTER TABLE ... RENAME TO`.
//! - [`authorize`] is the engine's authorizer for client statements, consulted for every table,
//!   pragma and function a statement touches while it is compiled, with the database each
//!   action is in: nothing in the `temp` database (SQLite names it so whatever the statement
//!   wrote: `temp.`, `"TEMP".`, `CREATE TEMP ...`), no `ATTACH`/`DETACH`, no extension loading,
//!   `PRAGMA` limited to read-only introspection of the client's objects, `dbstat` refused, no
//!   transaction control, and no name in the server's namespace (`_sqlhttp*`, any case), in
//!   any role a statement gives it.
//! - [`SchemaRows`] is what a statement that changes a schema is checked against before its
//!   effects are kept ([`SchemaRows::refusal`]): no temporary object, no new or changed object in
//!   the server's namespace, as the schema tables list them.
//! - [`configure`] applies the connection settings no client can change: size limits, defensive
//!   mode, untrusted schemas, foreign keys.
//! - FTS5's `rank` (ADR 0032): a query that constrains it (`rank MATCH 'f(...)'`, `rank = ...`,
//!   however spelled) is found in its compiled plan ([`refuse_rank_constraint`]), and a
//!   statement that changes a full-text table's stored `rank` setting is undone
//!   ([`SchemaRows`] reads it for the tables [`fts5_inserted`] names): either would make
//!   the table call a function of the client's choosing inside one step of the virtual table.
//!
//! See `docs/adr/0012-statement-sandbox.md` and `docs/adr/0023-sandbox-decides-on-effects.md`.
//! Knows SQLite and the protocol's error codes; nothing about HTTP or how connections are pooled.

use std::cell::{Cell, RefCell};

use rusqlite::fallible_iterator::FallibleIterator as _;
use rusqlite::hooks::{AuthAction, AuthContext};
use rusqlite::limits::Limit;
use rusqlite::{Connection, OptionalExtension, config::DbConfig};

use crate::config::Limits;
use crate::engine::sandbox::TRANSACTION_HINT;
use crate::engine::sql_text::leading;
use crate::protocol::error::ApiError;

/// Prefix of every name the server owns (tables, indexes, triggers, savepoints); compared
/// without regard to ASCII case, as SQLite compares names.
pub(crate) const SERVER_PREFIX: &str = "_sqlhttp";

/// The database SQLite names `temp`, however a statement spelled it.
const TEMP_DATABASE: &str = "temp";

/// The schema table of the `temp` database, as SQLite names it to the authorizer.
const TEMP_SCHEMA_TABLE: &str = "sqlite_temp_master";

/// The schema table of every other database, as SQLite names it to the authorizer.
const SCHEMA_TABLE: &str = "sqlite_master";

/// Virtual-table modules no client may use: `dbstat` shows every table's pages and sizes.
const DENIED_MODULES: &[&str] = &["dbstat"];

/// Pragmas a client may run with an argument: read-only introspection of the schema.
const INTROSPECTION_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "collation_list",
    "quick_check",
    "integrity_check",
];

/// Pragmas a client may read (never set), the server's connection settings among them.
const READABLE_PRAGMAS: &[&str] = &[
    "user_version",
    "application_id",
    "schema_version",
    "data_version",
    "foreign_keys",
    "journal_mode",
    "synchronous",
    "busy_timeout",
    "auto_vacuum",
    "encoding",
    "page_size",
    "page_count",
    "freelist_count",
];

/// Table-valued pragma functions that would disclose what is not the client's (file paths).
const HIDDEN_PRAGMA_TABLES: &[&str] = &["pragma_database_list"];

/// Functions no client may call.
const DENIED_FUNCTIONS: &[&str] = &["load_extension", "fts3_tokenizer"];

/// Full-text auxiliary functions whose one call is quadratic in a row's phrase matches (FTS5's
/// `snippet` and `highlight`: 40 000 matches took 10.7 s in one step, past every clock; FTS3's
/// `snippet` shares the name, and the authorizer is told the name only). ADR 0026.
const UNBOUNDED_FUNCTIONS: &[&str] = &["snippet", "highlight"];

/// Why [`UNBOUNDED_FUNCTIONS`] are refused, and what to do instead.
const UNBOUNDED_REFUSED: &str = "is not allowed: one call takes time quadratic in the row's \
matches, and nothing can stop it (not the statement timeout, a client that leaves, or a \
shutdown). Select the matching rows (MATCH, bm25() or rank to order them) and the column, \
and mark the matches on the client";

/// Why nothing in the `temp` database is the client's.
const TEMP_REFUSED: &str = "temporary tables, indexes, views, triggers and virtual tables are \
not allowed, however they are named (TEMP, temp.name): requests may run on different \
connections, so they would appear and vanish at random, and would hide the tables of the \
same name from every later request on their connection";

/// Refuses, on SQLite, an `ALTER TABLE ... RENAME TO` whose new name is in the server's
/// namespace: SQLite's authorizer is told the old name only. An early, clear answer; what the
/// statement does to the schema is checked after it ran ([`SchemaRows`]) whatever its text.
pub(crate) fn check_new_names(sql: &str) -> Result<(), ApiError> {
    match renamed_to(sql) {
        Some(name) if is_server_object(&name) => Err(ApiError::not_allowed(reserved(&name))),
        _ => Ok(()),
    }
}

fn reserved(name: &str) -> String {
    format!(
        "`{name}` is in the server's namespace: objects whose names start with {SERVER_PREFIX} \
         (in any case) are the server's, and cannot be read, changed, created, renamed, \
         indexed or dropped"
    )
}

fn is_server_object(name: &str) -> bool {
    name.len() >= SERVER_PREFIX.len()
        && name.as_bytes()[..SERVER_PREFIX.len()].eq_ignore_ascii_case(SERVER_PREFIX.as_bytes())
}

fn is_listed(list: &[&str], name: &str) -> bool {
    list.iter().any(|entry| entry.eq_ignore_ascii_case(name))
}

/// What the authorizer saw of the statement being compiled on this thread. The engine
/// compiles and runs each client statement on the thread that owns its connection, and SQLite
/// calls the authorizer on that thread, while the statement is compiled.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    /// It creates, drops or alters an object (or writes a schema table, as DDL does).
    changes_schema: bool,
    /// It is an `ALTER TABLE`, whose own nested statements rewrite the temp schema's views and
    /// triggers that name the table (there are none: clients cannot create any).
    alters_table: bool,
    /// It reads a column named `rank` (FTS5's hidden column, or any other of that name).
    reads_rank: bool,
}

thread_local! {
    static SEEN: Cell<Seen> = const {
        Cell::new(Seen {
            changes_schema: false,
            alters_table: false,
            reads_rank: false,
        })
    };
    /// The tables the statement inserts into, as the authorizer named them.
    static INSERTED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Forgets what the authorizer saw: call it before compiling a client statement.
pub(crate) fn begin_statement() {
    SEEN.set(Seen::default());
    INSERTED.with_borrow_mut(Vec::clear);
}

/// Whether the statement compiled since [`begin_statement`] reads a column named `rank`: its
/// plan is then checked by [`refuse_rank_constraint`].
pub(crate) fn reads_rank() -> bool {
    SEEN.get().reads_rank
}

/// Why a statement that constrains or configures FTS5's `rank` is refused, and what to do.
pub(crate) const RANK_REFUSED: &str = "FTS5's rank may not be set to a function here, neither \
by a query (a `rank MATCH` or `rank =` constraint) nor by the table's 'rank' configuration \
command: the table calls that function inside one step of its own, which nothing can stop \
(not the statement timeout, a client that leaves, or a shutdown), and snippet() and \
highlight() take time quadratic in a row's matches. ORDER BY rank ranks by bm25() with its \
default weights; for other weights call it directly: ORDER BY bm25(table, 10.0, 1.0)";

/// Refuses `sql` (compiled once already, on `conn`, and found to read a column named `rank`)
/// if its plan hands a `rank` constraint to an FTS5 table: FTS5 marks that constraint `r` in
/// the plan string its `xBestIndex` returns, which SQLite shows as the `VFilter` opcode's P4
/// (`rM1` for `t MATCH ? AND rank MATCH ?`). This sees the constraint however the statement
/// spells it (`rank MATCH`, `rank = x`, `x = t.rank`, `match(x, rank)`, in a view or a
/// subquery). An `EXPLAIN` itself runs nothing. Compile it sandboxed, as the statement was.
pub(crate) fn refuse_rank_constraint(conn: &Connection, sql: &str) -> Result<(), RankError> {
    if leading(sql, &["EXPLAIN"]).is_some() {
        return Ok(());
    }
    let explain = format!("EXPLAIN {sql}");
    let mut batch = rusqlite::Batch::new(conn, &explain);
    let Some(mut plan) = batch.next().map_err(RankError::Engine)? else {
        return Ok(());
    };
    let mut rows = plan.raw_query();
    while let Some(row) = rows.next().map_err(RankError::Engine)? {
        let opcode: String = row.get(1).map_err(RankError::Engine)?;
        if opcode != "VFilter" {
            continue;
        }
        let idx: Option<String> = row.get(5).map_err(RankError::Engine)?;
        if idx.as_deref().is_some_and(is_fts5_rank_plan) {
            return Err(RankError::Refused);
        }
    }
    Ok(())
}

/// Whether a virtual table's plan string is FTS5's and holds a `rank` constraint: FTS5's
/// strings are made of `r`, `M`/`L`/`G` and a column number, `=`, `<` and `>` only (R*Tree's
/// use other letters, and a plan string of any other module with an `r` has others too).
fn is_fts5_rank_plan(idx: &str) -> bool {
    idx.contains('r')
        && idx.bytes().all(|b| {
            matches!(b, b'r' | b'M' | b'L' | b'G' | b'=' | b'<' | b'>') || b.is_ascii_digit()
        })
}

/// Why [`refuse_rank_constraint`] failed.
#[derive(Debug)]
pub(crate) enum RankError {
    /// The plan constrains FTS5's rank.
    Refused,
    /// The plan could not be read.
    Engine(rusqlite::Error),
}

/// The FTS5 tables among those the statement compiled since [`begin_statement`] inserts into
/// (the virtual tables of `main` that have a `NAME_config` table): an insert into one may be its
/// configuration command. Read outside the sandbox.
pub(crate) fn fts5_inserted(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut names = INSERTED.with_borrow(Clone::clone);
    names.sort_unstable_by_key(|name| name.to_ascii_lowercase());
    names.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    let mut found = Vec::new();
    let mut query = conn.prepare_cached(
        "SELECT name FROM main.sqlite_schema WHERE type = 'table' AND name = ?1 COLLATE NOCASE \
         AND sql LIKE 'CREATE VIRTUAL TABLE%' AND EXISTS (SELECT 1 FROM main.sqlite_schema \
         WHERE type = 'table' AND name = ?1 || '_config' COLLATE NOCASE)",
    )?;
    for name in names {
        if let Some(table) = query
            .query_row([&name], |row| row.get::<_, String>(0))
            .optional()?
        {
            found.push(table);
        }
    }
    Ok(found)
}

/// Whether the statement compiled since [`begin_statement`] changes a schema: it must then run
/// under [`SchemaRows`]' check.
pub(crate) fn changes_schema() -> bool {
    SEEN.get().changes_schema
}

fn note(action: &AuthAction<'_>) {
    use AuthAction as A;
    let schema_table = |name: &str| {
        name.eq_ignore_ascii_case(SCHEMA_TABLE) || name.eq_ignore_ascii_case(TEMP_SCHEMA_TABLE)
    };
    let mut seen = SEEN.get();
    match *action {
        A::Read { column_name, .. } if column_name.eq_ignore_ascii_case("rank") => {
            seen.reads_rank = true;
        }
        A::Insert { table_name } if !schema_table(table_name) => {
            INSERTED.with_borrow_mut(|names| names.push(table_name.to_owned()));
            return;
        }
        A::AlterTable { .. } => {
            seen.changes_schema = true;
            seen.alters_table = true;
        }
        A::CreateIndex { .. }
        | A::CreateTable { .. }
        | A::CreateTempIndex { .. }
        | A::CreateTempTable { .. }
        | A::CreateTempTrigger { .. }
        | A::CreateTempView { .. }
        | A::CreateTrigger { .. }
        | A::CreateView { .. }
        | A::CreateVtable { .. }
        | A::DropIndex { .. }
        | A::DropTable { .. }
        | A::DropTempIndex { .. }
        | A::DropTempTable { .. }
        | A::DropTempTrigger { .. }
        | A::DropTempView { .. }
        | A::DropTrigger { .. }
        | A::DropView { .. }
        | A::DropVtable { .. } => seen.changes_schema = true,
        A::Insert { table_name } | A::Delete { table_name } | A::Update { table_name, .. }
            if schema_table(table_name) =>
        {
            seen.changes_schema = true;
        }
        _ => return,
    }
    SEEN.set(seen);
}

/// The sandbox's verdict on one thing a client statement touches, with the database SQLite
/// says it is in: `Err` carries the reason the client is told.
pub(crate) fn authorize(context: &AuthContext<'_>) -> Result<(), String> {
    use AuthAction as A;
    let action = &context.action;
    note(action);
    let database = match *action {
        A::AlterTable { database_name, .. } => Some(database_name),
        _ => context.database_name,
    };
    let temp_schema_table = matches!(
        *action,
        A::Read { table_name, .. } | A::Update { table_name, .. }
            if table_name.eq_ignore_ascii_case(TEMP_SCHEMA_TABLE)
    );
    // `SELECT count(*) FROM sqlite_temp_schema` names no database: the table says it.
    if temp_schema_table || database.is_some_and(|name| name.eq_ignore_ascii_case(TEMP_DATABASE)) {
        // SQLite's own ALTER TABLE reads and rewrites the temp schema's views and triggers that
        // name the table it alters; a client may neither (defensive mode refuses writes to a
        // schema table anyway).
        let own_rewrite = temp_schema_table && SEEN.get().alters_table;
        return if own_rewrite {
            Ok(())
        } else {
            Err(TEMP_REFUSED.to_owned())
        };
    }
    let server_name = |name: &str| {
        if is_server_object(name) {
            Err(reserved(name))
        } else {
            Ok(())
        }
    };
    match *action {
        A::Attach { .. } | A::Detach { .. } => Err(
            "ATTACH and DETACH are not allowed: a statement reaches the served database only"
                .to_owned(),
        ),
        A::Transaction { .. } | A::Savepoint { .. } => Err(TRANSACTION_HINT.to_owned()),
        A::CreateTempTable { .. }
        | A::CreateTempIndex { .. }
        | A::CreateTempTrigger { .. }
        | A::CreateTempView { .. }
        | A::DropTempTable { .. }
        | A::DropTempIndex { .. }
        | A::DropTempTrigger { .. }
        | A::DropTempView { .. } => Err(TEMP_REFUSED.to_owned()),
        A::Pragma {
            pragma_name,
            pragma_value,
        } => {
            let allowed = is_listed(INTROSPECTION_PRAGMAS, pragma_name)
                || (pragma_value.is_none() && is_listed(READABLE_PRAGMAS, pragma_name));
            if !allowed {
                return Err(format!(
                    "PRAGMA {pragma_name}{} is not allowed: connection settings are the \
                     server's; allowed are the read-only pragmas {} and reading {}",
                    if pragma_value.is_some() {
                        " with a value"
                    } else {
                        ""
                    },
                    INTROSPECTION_PRAGMAS.join(", "),
                    READABLE_PRAGMAS.join(", ")
                ));
            }
            // `PRAGMA table_info(_sqlhttp_idempotency)`, and the table-valued forms, which
            // SQLite runs as this pragma.
            pragma_value.map_or(Ok(()), server_name)
        }
        A::Function { function_name } if is_listed(DENIED_FUNCTIONS, function_name) => {
            Err(format!("the function {function_name}() is not allowed"))
        }
        A::Function { function_name } if is_listed(UNBOUNDED_FUNCTIONS, function_name) => Err(
            format!("the function {function_name}() {UNBOUNDED_REFUSED}"),
        ),
        A::Read { table_name, .. } if is_listed(HIDDEN_PRAGMA_TABLES, table_name) => Err(format!(
            "{table_name} is not allowed: it reveals the server's files"
        )),
        A::Read { table_name, .. } if is_listed(DENIED_MODULES, table_name) => Err(format!(
            "{table_name} is not allowed: it reveals the size and layout of the server's tables"
        )),
        A::CreateVtable { module_name, .. } if is_listed(DENIED_MODULES, module_name) => {
            Err(format!(
                "virtual tables USING {module_name} are not allowed: it reveals the size and \
                 layout of the server's tables"
            ))
        }
        A::CreateIndex {
            index_name: object,
            table_name,
        }
        | A::DropIndex {
            index_name: object,
            table_name,
        }
        | A::CreateTrigger {
            trigger_name: object,
            table_name,
        }
        | A::DropTrigger {
            trigger_name: object,
            table_name,
        } => server_name(object).and_then(|()| server_name(table_name)),
        A::CreateTable { table_name }
        | A::Delete { table_name }
        | A::DropTable { table_name }
        | A::Insert { table_name }
        | A::Read { table_name, .. }
        | A::Update { table_name, .. }
        | A::AlterTable { table_name, .. }
        | A::Analyze { table_name }
        | A::CreateVtable { table_name, .. }
        | A::DropVtable { table_name, .. } => server_name(table_name),
        A::CreateView { view_name } | A::DropView { view_name } => server_name(view_name),
        A::Reindex { index_name } => server_name(index_name),
        _ => Ok(()),
    }
}

/// The schema rows a client statement may not create or change, read before and after a
/// statement that changes a schema: every object of the `temp` database but the server's
/// `_sqlhttp_rowid_probe` (see `exec`), and every object of `main` whose name, or whose table's
/// name, is in the server's namespace. Read outside the sandbox.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SchemaRows {
    temp: Vec<(String, String)>,
    reserved: Vec<(String, String, String)>,
    /// The stored `rank` settings of the FTS5 tables the statement inserts into: table, key as
    /// stored (FTS5 takes it in any case), value as `quote()` writes it.
    rank: Vec<(String, String, String)>,
}

/// Objects of `temp` other than the server's probe table.
const TEMP_ROWS: &str = "SELECT type, name FROM temp.sqlite_schema \
WHERE NOT (type = 'table' AND name = '_sqlhttp_rowid_probe') ORDER BY type, name";

/// Objects of `main` in the server's namespace, or on a table in it.
const RESERVED_ROWS: &str = "SELECT type, name, tbl_name FROM main.sqlite_schema \
WHERE substr(name, 1, 8) = '_sqlhttp' COLLATE NOCASE \
OR substr(tbl_name, 1, 8) = '_sqlhttp' COLLATE NOCASE ORDER BY type, name, tbl_name";

impl SchemaRows {
    /// Reads the rows from the schema tables, and the `rank` settings of the FTS5 tables `fts5`.
    pub(crate) fn read(conn: &Connection, fts5: &[String]) -> rusqlite::Result<SchemaRows> {
        let mut rank = Vec::new();
        for table in fts5 {
            let config = format!("{table}_config").replace('"', "\"\"");
            let mut query = conn.prepare(&format!(
                "SELECT k, quote(v) FROM main.\"{config}\" WHERE k = 'rank' COLLATE NOCASE \
                 ORDER BY k"
            ))?;
            let rows = query.query_map([], |row| Ok((table.clone(), row.get(0)?, row.get(1)?)))?;
            for row in rows {
                rank.push(row?);
            }
        }
        let temp = conn
            .prepare_cached(TEMP_ROWS)?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let reserved = conn
            .prepare_cached(RESERVED_ROWS)?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(SchemaRows {
            temp,
            reserved,
            rank,
        })
    }

    /// Why a statement that took the schema from `self` to `after` must not be kept: it left a
    /// temporary object, or it created, renamed or changed an object in the server's namespace.
    /// Whether a full-text table's stored `rank` setting differs in `after`.
    pub(crate) fn rank_changed(&self, after: &SchemaRows) -> bool {
        after.rank != self.rank
    }

    pub(crate) fn refusal(&self, after: &SchemaRows) -> Option<String> {
        if self.rank_changed(after) {
            return Some(RANK_REFUSED.to_owned());
        }
        if let Some((kind, name)) = after.temp.first() {
            return Some(format!(
                "the statement would create the temporary {kind} `{name}`: {TEMP_REFUSED}"
            ));
        }
        if after.reserved != self.reserved {
            let name = after
                .reserved
                .iter()
                .find(|row| !self.reserved.contains(row))
                .or_else(|| {
                    self.reserved
                        .iter()
                        .find(|row| !after.reserved.contains(row))
                })
                .map_or(SERVER_PREFIX, |(_, name, _)| name.as_str());
            return Some(format!(
                "the statement would change the server's namespace: {}",
                reserved(name)
            ));
        }
        None
    }
}

/// The new name of an `ALTER TABLE [schema.]table RENAME TO name` (dequoted), read as SQLite
/// reads the text; `None` for any other statement (`RENAME [COLUMN] a TO b` included).
fn renamed_to(sql: &str) -> Option<String> {
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
enum Token {
    /// A bare word: a keyword or a name.
    Word(String),
    /// A quoted name or string, without its quotes (`"x"`, `` `x` ``, `[x]`, `'x'`).
    Quoted(String),
    Dot,
    /// Anything else (one character).
    Other,
}

/// SQLite's tokens, comments and white space skipped (block comments do not nest in SQLite).
struct Tokens<'a>(&'a str);

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
fn quoted(text: &str, open: char, close: char) -> (Token, usize) {
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

/// Applies the settings every connection has, whatever its role: size limits, no attached
/// databases, defensive mode (no writes to the schema table, no corrupting pragmas), untrusted
/// schemas, and foreign keys enforced.
pub(crate) fn configure(conn: &Connection, limits: &Limits) -> rusqlite::Result<()> {
    let clamp = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, clamp(limits.max_value_bytes))?;
    // The server's own statements are short; the margin keeps them clear of a small limit.
    conn.set_limit(
        Limit::SQLITE_LIMIT_SQL_LENGTH,
        clamp(limits.max_sql_bytes.saturating_add(4096)),
    )?;
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    conn.execute_batch("PRAGMA foreign_keys = ON")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::hooks::TransactionOperation;

    #[test]
    fn authorizer_table() {
        use AuthAction as A;
        let allowed = [
            A::Select,
            A::Read {
                table_name: "users",
                column_name: "id",
            },
            A::Insert {
                table_name: "users",
            },
            A::CreateTable {
                table_name: "sqlhttp_mine",
            },
            A::Pragma {
                pragma_name: "table_info",
                pragma_value: Some("users"),
            },
            A::Pragma {
                pragma_name: "INDEX_LIST",
                pragma_value: Some("users"),
            },
            A::Pragma {
                pragma_name: "user_version",
                pragma_value: None,
            },
            A::Function {
                function_name: "upper",
            },
            A::Read {
                table_name: "pragma_table_info",
                column_name: "name",
            },
        ];
        for action in &allowed {
            assert_eq!(authorize(&in_main(*action)), Ok(()), "{action:?}");
        }
        let denied = [
            A::Attach {
                filename: "/tmp/x.db",
            },
            A::Detach { database_name: "x" },
            A::Transaction {
                operation: TransactionOperation::Begin,
            },
            A::Savepoint {
                operation: TransactionOperation::Begin,
                savepoint_name: "s",
            },
            A::Pragma {
                pragma_name: "foreign_keys",
                pragma_value: Some("OFF"),
            },
            A::Pragma {
                pragma_name: "journal_mode",
                pragma_value: Some("OFF"),
            },
            A::Pragma {
                pragma_name: "user_version",
                pragma_value: Some("7"),
            },
            A::Pragma {
                pragma_name: "database_list",
                pragma_value: None,
            },
            A::Pragma {
                pragma_name: "writable_schema",
                pragma_value: Some("1"),
            },
            A::Function {
                function_name: "load_extension",
            },
            A::Function {
                function_name: "LOAD_EXTENSION",
            },
            A::Read {
                table_name: "pragma_database_list",
                column_name: "file",
            },
            A::Read {
                table_name: "_sqlhttp_idempotency",
                column_name: "key",
            },
            A::Read {
                table_name: "_SQLHTTP_IDEMPOTENCY",
                column_name: "key",
            },
            A::Delete {
                table_name: "_sqlhttp_idempotency",
            },
            A::DropTable {
                table_name: "_sqlhttp_idempotency",
            },
            A::Update {
                table_name: "_sqlhttp_idempotency",
                column_name: "body",
            },
            A::CreateTrigger {
                trigger_name: "t",
                table_name: "_sqlhttp_idempotency",
            },
            A::CreateTable {
                table_name: "_sqlhttp_evil",
            },
            A::CreateView {
                view_name: "_sqlhttp_view",
            },
            A::CreateTempTable { table_name: "t" },
            A::CreateTempTrigger {
                trigger_name: "t",
                table_name: "users",
            },
        ];
        for action in &denied {
            assert!(authorize(&in_main(*action)).is_err(), "{action:?}");
        }
    }

    fn in_database<'c>(action: AuthAction<'c>, database: &'c str) -> AuthContext<'c> {
        AuthContext {
            action,
            database_name: Some(database),
            accessor: None,
        }
    }

    fn in_main(action: AuthAction<'_>) -> AuthContext<'_> {
        in_database(action, "main")
    }

    #[test]
    fn nothing_in_the_temp_database_whatever_the_action() {
        use AuthAction as A;
        let actions = [
            A::CreateTable { table_name: "x" },
            A::CreateView { view_name: "v" },
            A::CreateIndex {
                index_name: "i",
                table_name: "x",
            },
            A::CreateTrigger {
                trigger_name: "t",
                table_name: "orders",
            },
            A::CreateVtable {
                table_name: "r",
                module_name: "rtree",
            },
            A::Insert {
                table_name: "sqlite_temp_master",
            },
            A::Insert { table_name: "x" },
            A::Read {
                table_name: "x",
                column_name: "a",
            },
            A::Read {
                table_name: "sqlite_temp_master",
                column_name: "sql",
            },
            A::Pragma {
                pragma_name: "table_info",
                pragma_value: Some("x"),
            },
        ];
        for spelling in ["temp", "TEMP", "TeMp"] {
            for action in actions {
                begin_statement();
                assert!(
                    authorize(&in_database(action, spelling)).is_err(),
                    "{action:?} in {spelling}"
                );
            }
        }
        // ALTER TABLE names its database in the action.
        let alter = A::AlterTable {
            database_name: "temp",
            table_name: "x",
        };
        assert!(
            authorize(&AuthContext {
                action: alter,
                database_name: None,
                accessor: None,
            })
            .is_err()
        );
        // SQLite's own ALTER TABLE of a main table rewrites temp's schema table; a client may not.
        begin_statement();
        let rewrite = A::Update {
            table_name: "sqlite_temp_master",
            column_name: "sql",
        };
        assert!(authorize(&in_database(rewrite, "temp")).is_err());
        let alter = A::AlterTable {
            database_name: "main",
            table_name: "t",
        };
        assert_eq!(authorize(&in_main(alter)), Ok(()));
        assert_eq!(authorize(&in_database(rewrite, "temp")), Ok(()));
        assert!(changes_schema());
        begin_statement();
        assert!(!changes_schema());
    }

    #[test]
    fn every_name_a_statement_gives_is_checked() {
        use AuthAction as A;
        for action in [
            A::CreateTrigger {
                trigger_name: "_sqlhttp_x",
                table_name: "t",
            },
            A::CreateIndex {
                index_name: "_SQLHTTP_i",
                table_name: "t",
            },
            A::DropTrigger {
                trigger_name: "_sqlhttpx",
                table_name: "t",
            },
            A::CreateTable {
                table_name: "_sqlhttpfoo",
            },
            A::Pragma {
                pragma_name: "table_info",
                pragma_value: Some("_SqlHttp_idempotency"),
            },
            A::Read {
                table_name: "dbstat",
                column_name: "pgsize",
            },
            A::CreateVtable {
                table_name: "stats",
                module_name: "DBSTAT",
            },
        ] {
            assert!(authorize(&in_main(action)).is_err(), "{action:?}");
        }
        for action in [
            A::CreateTrigger {
                trigger_name: "audit",
                table_name: "sqlhttp_t",
            },
            A::CreateVtable {
                table_name: "r",
                module_name: "rtree",
            },
        ] {
            assert_eq!(authorize(&in_main(action)), Ok(()), "{action:?}");
        }
    }

    #[test]
    fn the_new_name_of_a_rename_is_read_as_sqlite_reads_it() {
        for (sql, name) in [
            ("ALTER TABLE t RENAME TO u", Some("u")),
            ("alter table main.t rename to \"_sq\"\"x\"", Some("_sq\"x")),
            (
                "ALTER TABLE [a b] RENAME TO [_sqlhttp_x]",
                Some("_sqlhttp_x"),
            ),
            ("ALTER TABLE t RENAME TO `x``y`", Some("x`y")),
            ("ALTER TABLE t RENAME TO 'lit'", Some("lit")),
            (
                "/* a */ ALTER -- b\n TABLE \"main\" . t /**/ RENAME\tTO _sqlhttp",
                Some("_sqlhttp"),
            ),
            ("ALTER TABLE t RENAME a TO _sqlhttp_x", None),
            ("ALTER TABLE t RENAME COLUMN a TO _sqlhttp_x", None),
            ("ALTER TABLE rename RENAME TO x", Some("x")),
            ("ALTER TABLE t ADD COLUMN _sqlhttp_x", None),
            ("SELECT 'ALTER TABLE t RENAME TO _sqlhttp_x'", None),
            ("ALTER TABLE t RENAME TO \"unterminated", None),
        ] {
            assert_eq!(renamed_to(sql).as_deref(), name, "{sql}");
        }
        assert!(check_new_names("ALTER TABLE t RENAME TO \"_SQLHTTP_x\"").is_err());
        assert!(check_new_names("ALTER TABLE _sqlhttp_t RENAME a TO b").is_ok());
    }

    /// What the authorizer is not told (a rename's new name; which database a trigger goes
    /// into), the check of the schema after the statement sees.
    #[test]
    fn the_schema_check_sees_what_a_statement_did() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TEMP TABLE _sqlhttp_rowid_probe (x INTEGER);
             CREATE TABLE _sqlhttp_idempotency (key);
             CREATE TABLE t (v); CREATE TABLE u (v);",
        )
        .unwrap();
        let before = SchemaRows::read(&conn, &[]).unwrap();
        assert_eq!(before.refusal(&before), None);
        for (statement, refused) in [
            ("ALTER TABLE t RENAME TO _SQLHTTP_mine", true),
            (
                "CREATE TRIGGER temp.x AFTER INSERT ON main.t BEGIN SELECT 1; END",
                true,
            ),
            ("CREATE TABLE temp.x (a)", true),
            ("CREATE INDEX i ON _sqlhttp_idempotency (key)", true),
            ("DROP TABLE _sqlhttp_idempotency", true),
            ("ALTER TABLE t RENAME TO renamed", false),
            (
                "CREATE TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; END",
                false,
            ),
        ] {
            conn.execute_batch("SAVEPOINT s").unwrap();
            conn.execute_batch(statement).unwrap();
            let after = SchemaRows::read(&conn, &[]).unwrap();
            assert_eq!(before.refusal(&after).is_some(), refused, "{statement}");
            conn.execute_batch("ROLLBACK TO s; RELEASE s").unwrap();
        }
    }

    mod effects {
        //! The sandbox's verdict on schema-qualified DDL against what SQLite would create.

        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;

        use proptest::prelude::*;

        use crate::config::{Database, Limits};
        use crate::engine::sqlite::connection::{Conn, Role, Target};
        use crate::engine::sqlite::control::Hooks;
        use crate::engine::sqlite::{exec, keyed as idempotency};
        use crate::protocol::error::ErrorCode;
        use crate::protocol::request::SqlRequest;

        /// The server's writer as it starts, with a client's table `base`.
        const CLIENT_SCHEMA: &str = "CREATE TABLE base (id INTEGER PRIMARY KEY, v)";

        fn writer() -> Conn {
            let hooks = Arc::new(Hooks::new(Arc::new(AtomicBool::new(false))));
            let target = Target::new(&Database::Memory).unwrap();
            let conn = Conn::open(&target, Role::Writer, Limits::default(), hooks).unwrap();
            conn.conn.execute_batch(exec::ROWID_PROBE_DDL).unwrap();
            idempotency::create_table(&conn.conn).unwrap();
            conn.conn.execute_batch(CLIENT_SCHEMA).unwrap();
            conn
        }

        /// The same schema on a plain connection, no sandbox at all.
        fn scratch() -> rusqlite::Connection {
            let conn = rusqlite::Connection::open_in_memory().unwrap();
            conn.execute_batch(exec::ROWID_PROBE_DDL).unwrap();
            idempotency::create_table(&conn).unwrap();
            conn.execute_batch(CLIENT_SCHEMA).unwrap();
            conn
        }

        /// Every row of both schema tables: (database, type, name, table).
        fn schema(conn: &rusqlite::Connection) -> Vec<(String, String, String, String)> {
            let mut rows = Vec::new();
            for database in ["main", "temp"] {
                let mut stmt = conn
                    .prepare(&format!(
                        "SELECT type, name, tbl_name FROM {database}.sqlite_schema"
                    ))
                    .unwrap();
                let found = stmt
                    .query_map([], |row| {
                        Ok((database.to_owned(), row.get(0)?, row.get(1)?, row.get(2)?))
                    })
                    .unwrap();
                rows.extend(found.map(Result::unwrap));
            }
            rows.sort();
            rows
        }

        fn is_reserved(name: &str) -> bool {
            super::is_server_object(name)
        }

        fn schema_spelling() -> impl Strategy<Value = &'static str> {
            prop_oneof![
                6 => Just(""),
                3 => Just("main."),
                1 => Just("\"main\"."),
                1 => Just("MAIN."),
                1 => Just("temp."),
                1 => Just("TEMP."),
                1 => Just("\"TEMP\"."),
                1 => Just("\"TeMp\"."),
                1 => Just("[temp]."),
                1 => Just("`tEmP`."),
                1 => Just("temp /* */ . "),
            ]
        }

        fn temp_keyword() -> impl Strategy<Value = &'static str> {
            prop_oneof![4 => Just(""), 1 => Just("TEMP "), 1 => Just("temporary ")]
        }

        /// A name as a statement spells it, quoted or not: `(spelled, spelled with a suffix)`.
        fn object_name() -> impl Strategy<Value = (String, String)> {
            let base = prop_oneof![
                6 => Just("obj"),
                1 => Just("base"),
                3 => Just("sqlhttp_fine"),
                1 => Just("_sqlhttp_x"),
                1 => Just("_SQLHTTP_idempotency"),
                1 => Just("_SqlHttpy"),
                1 => Just("_sqlhttp"),
                1 => Just("_sqlhttp_rowid_probe"),
            ];
            (base, 0..4_u8).prop_map(|(name, quote)| {
                let spell = |name: &str| match quote {
                    0 => name.to_owned(),
                    1 => format!("\"{name}\""),
                    2 => format!("[{name}]"),
                    _ => format!("`{name}`"),
                };
                (spell(name), spell(&format!("{name}_2")))
            })
        }

        /// The table an index or trigger is on (or a rename renames), and one of its columns.
        fn target_table() -> impl Strategy<Value = (&'static str, &'static str)> {
            prop_oneof![
                4 => Just(("base", "v")),
                2 => Just(("main.base", "v")),
                1 => Just(("_sqlhttp_idempotency", "status")),
                1 => Just(("_sqlhttp_rowid_probe", "x")),
                1 => Just(("temp._sqlhttp_rowid_probe", "x")),
            ]
        }

        fn trigger_body() -> impl Strategy<Value = &'static str> {
            prop_oneof![
                Just("SELECT 1;"),
                Just("DELETE FROM base;"),
                Just("INSERT INTO temp._sqlhttp_rowid_probe VALUES (1);"),
                Just("UPDATE _sqlhttp_rowid_probe SET x = 1;"),
            ]
        }

        /// Schema-qualified DDL: tables, views, indexes, triggers, virtual tables and renames,
        /// with every spelling of the schema and the TEMP keyword, reserved names among the
        /// others, quoted and cased. With the same statement for a name no object has yet (and
        /// no `IF NOT EXISTS`), which tells what a statement that found its object would have
        /// created.
        fn ddl() -> impl Strategy<Value = (String, String)> {
            (
                0..7_u8,
                schema_spelling(),
                temp_keyword(),
                object_name(),
                target_table(),
                trigger_body(),
                any::<bool>(),
            )
                .prop_map(
                    |(kind, schema, temp, (name, fresh), (on, column), body, if_not_exists)| {
                        // An index's table, and the table ALTER TABLE renames, go unqualified
                        // after the schema spelling.
                        let table = on.rsplit('.').next().unwrap_or(on);
                        let statement = |ine: &str, name: &str| match kind {
                            0 => format!("CREATE {temp}TABLE {ine}{schema}{name} (a, b)"),
                            1 => format!(
                                "CREATE {temp}TABLE {ine}{schema}{name} AS SELECT * FROM base"
                            ),
                            2 => format!(
                                "CREATE {temp}VIEW {ine}{schema}{name} AS SELECT v FROM base"
                            ),
                            3 => format!("CREATE INDEX {ine}{schema}{name} ON {table} ({column})"),
                            4 => format!(
                                "CREATE {temp}TRIGGER {ine}{schema}{name} AFTER INSERT ON {on} \
                                 BEGIN {body} END"
                            ),
                            5 => format!(
                                "CREATE VIRTUAL TABLE {ine}{schema}{name} USING rtree(id, a, b)"
                            ),
                            _ => format!("ALTER TABLE {schema}{table} RENAME TO {name}"),
                        };
                        let ine = if if_not_exists { "IF NOT EXISTS " } else { "" };
                        (statement(ine, &name), statement("", &fresh))
                    },
                )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// The sandbox refuses a statement exactly when, run without it, the statement
            /// would create a temporary object or change the server's namespace; otherwise the
            /// statement does in the sandbox what it does without it.
            #[test]
            fn the_verdict_is_what_sqlite_would_create((sql, fresh) in ddl()) {
                let forbidden_effect = |sql: &str| {
                    let plain = scratch();
                    let before = schema(&plain);
                    let ran = plain.execute_batch(sql);
                    let after = schema(&plain);
                    let touched = |row: &(String, String, String, String)| {
                        row.0 == "temp" || is_reserved(&row.2) || is_reserved(&row.3)
                    };
                    let forbidden = after.iter().any(|row| !before.contains(row) && touched(row))
                        || before.iter().any(|row| !after.contains(row) && touched(row));
                    (ran, before, after, forbidden)
                };
                let (ran, before, after, forbidden) = forbidden_effect(&sql);
                // `IF NOT EXISTS` that found its object does nothing. SQLite authorizes most
                // creations before it looks (a virtual table's after): one that would be refused
                // on a free name may be refused or do nothing; any other does nothing.
                let found = ran.is_ok() && before == after && sql.contains("IF NOT EXISTS");
                let may_be_refused = found && forbidden_effect(&fresh).3;

                let writer = writer();
                let request = SqlRequest { sql: sql.clone(), params: vec![], read_only: false };
                let verdict = exec::execute(&writer, &request, crate::engine::Access::ReadWrite)
                    .map(drop)
                    .map_err(|e| e.code);
                let kept = schema(&writer.conn);
                prop_assert!(writer.conn.is_autocommit());
                if forbidden {
                    prop_assert_eq!(verdict, Err(ErrorCode::StatementNotAllowed), "{}", sql);
                    prop_assert_eq!(kept, before, "a refused statement leaves nothing: {}", sql);
                } else if may_be_refused {
                    prop_assert!(
                        matches!(verdict, Ok(()) | Err(ErrorCode::StatementNotAllowed)),
                        "{}",
                        sql
                    );
                    prop_assert_eq!(kept, before, "{}", sql);
                } else if ran.is_ok() {
                    prop_assert_eq!(verdict, Ok(()), "{}", sql);
                    prop_assert_eq!(kept, after, "{}", sql);
                } else {
                    prop_assert!(verdict.is_err(), "{}", sql);
                    prop_assert_eq!(kept, before, "{}", sql);
                }
            }
        }
    }
}
