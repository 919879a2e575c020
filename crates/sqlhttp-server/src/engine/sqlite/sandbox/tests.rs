//! Tests of the sandbox: the authorizer's verdicts, action by action and name by name, the
//! reading of a rename's new name, and the schema check against what statements did.

use super::rename::renamed_to;
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
                        1 => {
                            format!("CREATE {temp}TABLE {ine}{schema}{name} AS SELECT * FROM base")
                        }
                        2 => format!("CREATE {temp}VIEW {ine}{schema}{name} AS SELECT v FROM base"),
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

#[test]
fn a_statement_may_be_kept_compiled_unless_it_reads_rank_runs_a_pragma_or_changes_a_schema() {
    use AuthAction as A;
    let read = A::Read {
        table_name: "t",
        column_name: "v",
    };
    for (spoils, action) in [
        (false, read),
        (
            false,
            A::Function {
                function_name: "upper",
            },
        ),
        (
            true,
            A::Read {
                table_name: "f5",
                column_name: "RANK",
            },
        ),
        (
            true,
            A::Pragma {
                pragma_name: "table_info",
                pragma_value: Some("t"),
            },
        ),
        (true, A::CreateView { view_name: "v" }),
    ] {
        begin_statement();
        let _ = authorize(&in_main(read));
        let _ = authorize(&in_main(action));
        assert_eq!(may_be_kept(), !spoils, "{action:?}");
    }
    begin_statement();
    assert!(may_be_kept());
}
