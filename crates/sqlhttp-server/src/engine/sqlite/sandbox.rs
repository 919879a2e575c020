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
//!
//! The rule tables (names, pragmas, functions, modules, and the reasons given) live in
//! [`rules`]; this file is the authorizer that applies them and what it records of the
//! statement being compiled, beside the checks in [`rank`], [`schema`] and [`rename`].

mod rank;
mod rename;
mod rules;
mod schema;
#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};

use rusqlite::hooks::{AuthAction, AuthContext};
use rusqlite::limits::Limit;
use rusqlite::{Connection, OptionalExtension, config::DbConfig};

use crate::config::Limits;
use crate::engine::sandbox::TRANSACTION_HINT;

pub(crate) use rank::{RankError, refuse_rank_constraint};
pub(crate) use rename::check_new_names;
pub(crate) use rules::RANK_REFUSED;
use rules::{
    DENIED_FUNCTIONS, DENIED_MODULES, HIDDEN_PRAGMA_TABLES, INTROSPECTION_PRAGMAS,
    READABLE_PRAGMAS, SCHEMA_TABLE, TEMP_DATABASE, TEMP_REFUSED, TEMP_SCHEMA_TABLE,
    UNBOUNDED_FUNCTIONS, UNBOUNDED_REFUSED, is_listed, is_server_object, reserved,
};
pub(crate) use schema::SchemaRows;

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
    /// It runs a `PRAGMA` (SQLite computes some of their answers as it compiles them).
    runs_pragma: bool,
}

thread_local! {
    static SEEN: Cell<Seen> = const {
        Cell::new(Seen {
            changes_schema: false,
            alters_table: false,
            reads_rank: false,
            runs_pragma: false,
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

/// Whether the read-only statement compiled since [`begin_statement`] may be kept compiled and
/// run again without being compiled (and so authorized) again (`statement_cache`): nothing
/// checked after its compile depends on what the authorizer saw (it reads no `rank` column),
/// and its answer is not fixed at compile time (it runs no `PRAGMA`, some of whose answers
/// SQLite computes as it compiles them).
pub(crate) fn may_be_kept() -> bool {
    let seen = SEEN.get();
    !seen.reads_rank && !seen.runs_pragma && !seen.changes_schema
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
        A::Pragma { .. } => seen.runs_pragma = true,
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
