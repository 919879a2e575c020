//! The statement sandbox: every rule a client's statement must pass, in one place. It decides
//! on what a statement does, not on how it is spelled (ADR 0023).
//!
//! - [`check_text`] looks at the SQL text before the engine sees it: size, NUL characters,
//!   transaction control (refused: each request is its own transaction) and `VACUUM`
//!   (`VACUUM INTO` writes a copy of the database to a path of the client's choosing).
//! - [`authorize`] is the engine's authorizer for client statements, consulted for every table,
//!   pragma and function a statement touches while it is compiled, with the database each
//!   action is in: nothing in the `temp` database (SQLite names it so whatever the statement
//!   wrote: `temp.`, `"TEMP".`, `CREATE TEMP ...`), no `ATTACH`/`DETACH`, no extension loading,
//!   `PRAGMA` limited to read-only introspection of the client's objects, `dbstat` refused, no
//!   transaction control, and no name in the server's namespace (`_sqlhttp*`, any case), in
//!   any role a statement gives it.
//! - [`configure`] applies the connection settings no client can change: size limits, defensive
//!   mode, untrusted schemas, foreign keys.
//!
//! See `docs/adr/0012-statement-sandbox.md` and `docs/adr/0023-sandbox-decides-on-effects.md`.
//! Knows SQLite and the protocol's error codes; nothing about HTTP or how connections are pooled.

use std::cell::Cell;

use rusqlite::hooks::{AuthAction, AuthContext};
use rusqlite::limits::Limit;
use rusqlite::{Connection, config::DbConfig};

use crate::api_error::{ApiError, ErrorCode};
use crate::config::Limits;
use crate::request::{is_transaction_control, leading_keywords};

/// Prefix of every name the server owns (tables, indexes, triggers, savepoints); compared
/// without regard to ASCII case, as SQLite compares names.
pub(crate) const SERVER_PREFIX: &str = "_sqlhttp";

/// The database SQLite names `temp`, however a statement spelled it.
const TEMP_DATABASE: &str = "temp";

/// The schema table of the `temp` database, as SQLite names it to the authorizer.
const TEMP_SCHEMA_TABLE: &str = "sqlite_temp_master";

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

/// How to do atomic multi-statement work, for every refusal of transaction control.
pub(crate) const TRANSACTION_HINT: &str = "transaction-control statements (BEGIN, COMMIT, END, \
ROLLBACK, SAVEPOINT, RELEASE) are not accepted: every request runs as its own transaction. \
For several statements that must apply together, send them as one atomic batch \
(POST /api/v1/batch)";

/// Why nothing in the `temp` database is the client's.
const TEMP_REFUSED: &str = "temporary tables, indexes, views, triggers and virtual tables are \
not allowed, however they are named (TEMP, temp.name): requests may run on different \
connections, so they would appear and vanish at random, and would hide the tables of the \
same name from every later request on their connection";

/// Checks a client's SQL text before it reaches the engine.
pub(crate) fn check_text(sql: &str, limits: &Limits) -> Result<(), ApiError> {
    if sql.len() > limits.max_sql_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the SQL text is {} bytes; this server accepts at most {} (--max-sql-bytes)",
                sql.len(),
                limits.max_sql_bytes
            ),
        ));
    }
    if sql.contains('\0') {
        // SQLite stops reading at a NUL: the text after it would be silently ignored.
        return Err(ApiError::sql("the SQL text contains a NUL character"));
    }
    if is_transaction_control(sql) {
        return Err(ApiError::bad_request(TRANSACTION_HINT));
    }
    if leading_keywords(sql)
        .iter()
        .any(|keyword| keyword == "VACUUM")
    {
        return Err(ApiError::not_allowed(
            "VACUUM is not allowed: the database file is the server's to maintain, \
             and VACUUM INTO would write a copy of it outside the served database",
        ));
    }
    Ok(())
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
    /// It is an `ALTER TABLE`, whose own nested statements rewrite the temp schema's views and
    /// triggers that name the table (there are none: clients cannot create any).
    alters_table: bool,
}

thread_local! {
    static SEEN: Cell<Seen> = const {
        Cell::new(Seen {
            alters_table: false,
        })
    };
}

/// Forgets what the authorizer saw: call it before compiling a client statement.
pub(crate) fn begin_statement() {
    SEEN.set(Seen::default());
}

fn note(action: &AuthAction<'_>) {
    if matches!(action, AuthAction::AlterTable { .. }) {
        SEEN.set(Seen { alters_table: true });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::hooks::TransactionOperation;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn text_checks() {
        let code = |sql: &str| check_text(sql, &limits()).map_err(|e| e.code);
        assert_eq!(code("SELECT 1"), Ok(()));
        assert_eq!(code("-- hi\n begin"), Err(ErrorCode::BadRequest));
        for sql in ["COMMIT", "END", "ROLLBACK TO x", "SAVEPOINT a", "RELEASE a"] {
            assert_eq!(code(sql), Err(ErrorCode::BadRequest), "{sql}");
        }
        assert_eq!(code("vacuum"), Err(ErrorCode::StatementNotAllowed));
        assert_eq!(
            code("/* x */ VACUUM INTO '/tmp/copy.db'"),
            Err(ErrorCode::StatementNotAllowed)
        );
        assert_eq!(code("SELECT 1\0"), Err(ErrorCode::SqlError));
        let long = format!("SELECT '{}'", "x".repeat(limits().max_sql_bytes));
        assert_eq!(code(&long), Err(ErrorCode::PayloadTooLarge));
        assert_eq!(code("SELECT 'BEGIN'"), Ok(()));
    }

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
        begin_statement();
        assert!(authorize(&in_database(rewrite, "temp")).is_err());
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
}
