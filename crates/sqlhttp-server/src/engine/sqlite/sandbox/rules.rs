//! The sandbox's rule tables: the server's namespace, the pragmas, functions and modules a
//! client may or may not use, and the reasons a refused statement is told.
//!
//! Data and name tests only; the authorizer that applies them is the parent module, and nothing
//! here knows SQLite's API.

/// Prefix of every name the server owns (tables, indexes, triggers, savepoints); compared
/// without regard to ASCII case, as SQLite compares names.
pub(crate) const SERVER_PREFIX: &str = "_sqlhttp";

/// The database SQLite names `temp`, however a statement spelled it.
pub(super) const TEMP_DATABASE: &str = "temp";

/// The schema table of the `temp` database, as SQLite names it to the authorizer.
pub(super) const TEMP_SCHEMA_TABLE: &str = "sqlite_temp_master";

/// The schema table of every other database, as SQLite names it to the authorizer.
pub(super) const SCHEMA_TABLE: &str = "sqlite_master";

/// Virtual-table modules no client may use: `dbstat` shows every table's pages and sizes.
pub(super) const DENIED_MODULES: &[&str] = &["dbstat"];

/// Pragmas a client may run with an argument: read-only introspection of the schema.
pub(super) const INTROSPECTION_PRAGMAS: &[&str] = &[
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
pub(super) const READABLE_PRAGMAS: &[&str] = &[
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
pub(super) const HIDDEN_PRAGMA_TABLES: &[&str] = &["pragma_database_list"];

/// Functions no client may call.
pub(super) const DENIED_FUNCTIONS: &[&str] = &["load_extension", "fts3_tokenizer"];

/// Full-text auxiliary functions whose one call is quadratic in a row's phrase matches (FTS5's
/// `snippet` and `highlight`: 40 000 matches took 10.7 s in one step, past every clock; FTS3's
/// `snippet` shares the name, and the authorizer is told the name only). ADR 0026.
pub(super) const UNBOUNDED_FUNCTIONS: &[&str] = &["snippet", "highlight"];

/// Why [`UNBOUNDED_FUNCTIONS`] are refused, and what to do instead.
pub(super) const UNBOUNDED_REFUSED: &str = "is not allowed: one call takes time quadratic in the row's \
matches, and nothing can stop it (not the statement timeout, a client that leaves, or a \
shutdown). Select the matching rows (MATCH, bm25() or rank to order them) and the column, \
and mark the matches on the client";

/// Why nothing in the `temp` database is the client's.
pub(super) const TEMP_REFUSED: &str = "temporary tables, indexes, views, triggers and virtual tables are \
not allowed, however they are named (TEMP, temp.name): requests may run on different \
connections, so they would appear and vanish at random, and would hide the tables of the \
same name from every later request on their connection";

/// Why a statement that constrains or configures FTS5's `rank` is refused, and what to do.
pub(crate) const RANK_REFUSED: &str = "FTS5's rank may not be set to a function here, neither \
by a query (a `rank MATCH` or `rank =` constraint) nor by the table's 'rank' configuration \
command: the table calls that function inside one step of its own, which nothing can stop \
(not the statement timeout, a client that leaves, or a shutdown), and snippet() and \
highlight() take time quadratic in a row's matches. ORDER BY rank ranks by bm25() with its \
default weights; for other weights call it directly: ORDER BY bm25(table, 10.0, 1.0)";

pub(super) fn reserved(name: &str) -> String {
    format!(
        "`{name}` is in the server's namespace: objects whose names start with {SERVER_PREFIX} \
         (in any case) are the server's, and cannot be read, changed, created, renamed, \
         indexed or dropped"
    )
}

pub(super) fn is_server_object(name: &str) -> bool {
    name.len() >= SERVER_PREFIX.len()
        && name.as_bytes()[..SERVER_PREFIX.len()].eq_ignore_ascii_case(SERVER_PREFIX.as_bytes())
}

pub(super) fn is_listed(list: &[&str], name: &str) -> bool {
    list.iter().any(|entry| entry.eq_ignore_ascii_case(name))
}
