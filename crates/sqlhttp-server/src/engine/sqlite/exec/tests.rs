//! Unit tests of `exec.rs`, beside it rather than in it so that the file holds its code alone.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::*;
use crate::config::{Database, Limits};
use crate::engine::sqlite::connection::{Role, Target};
use crate::engine::sqlite::control::Hooks;

fn conn_with(limits: Limits) -> Conn {
    let hooks = Arc::new(Hooks::new(Arc::new(AtomicBool::new(false))));
    let target = Target::new(&Database::Memory).unwrap();
    let conn = Conn::open(&target, Role::Writer, limits, hooks).unwrap();
    conn.conn.execute_batch(ROWID_PROBE_DDL).unwrap();
    conn
}

fn conn() -> Conn {
    conn_with(Limits::default())
}

fn run(conn: &Conn, sql: &str, params: Vec<Param>) -> Result<serde_json::Value, ApiError> {
    let request = SqlRequest {
        sql: sql.into(),
        params,
        read_only: false,
    };
    match execute(conn, &request, Access::ReadWrite)? {
        Ran::Done(body) => Ok(serde_json::from_slice(&body).unwrap()),
        Ran::NeedsWriter => unreachable!("read-write access runs everything"),
    }
}

#[test]
fn keys_come_in_protocol_order() {
    let request = SqlRequest {
        sql: "SELECT 1 AS one".into(),
        params: vec![],
        read_only: false,
    };
    let Ran::Done(body) = execute(&conn(), &request, Access::ReadOnly).unwrap() else {
        panic!("a SELECT runs read-only")
    };
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.starts_with(
            r#"{"columns":[{"name":"one","type":""}],"rows":[[1]],"rows_affected":0,"last_insert_id":null,"stats":{"duration_ms":"#
        ),
        "{text}"
    );
    assert!(
        text.ends_with(r#","rows_read":1,"rows_written":0,"served_by":"primary"}}"#),
        "{text}"
    );
}

#[test]
fn writes_are_handed_to_the_writer_under_read_only_access() {
    let conn = conn();
    conn.conn.execute_batch("CREATE TABLE a (x)").unwrap();
    for sql in [
        "INSERT INTO a VALUES (1)",
        "CREATE TABLE b (x)",
        "DELETE FROM a",
    ] {
        let request = SqlRequest {
            sql: sql.into(),
            params: vec![],
            read_only: false,
        };
        assert!(
            matches!(
                execute(&conn, &request, Access::ReadOnly),
                Ok(Ran::NeedsWriter)
            ),
            "{sql}"
        );
    }
    let count: i64 = conn
        .conn
        .query_row("SELECT count(*) FROM a", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 0, "nothing ran");
}

#[test]
fn values_map_to_json() {
    let value = run(
        &conn(),
        "SELECT ?, ?, ?, x'00ff10', NULL, 1e308 * 10, 'caf\u{e9}'",
        vec![
            Param::Integer(i64::MAX),
            Param::Real(0.25),
            Param::Text("a\"b".into()),
        ],
    )
    .unwrap();
    assert_eq!(
        value["rows"],
        serde_json::json!([[
            i64::MAX,
            0.25,
            "a\"b",
            {"base64": "AP8Q"},
            null,
            null,
            "caf\u{e9}"
        ]])
    );
}

#[test]
fn rowid_tracking_distinguishes_no_insert_from_equal_rowids() {
    let conn = conn();
    conn.conn
        .execute_batch("CREATE TABLE a (x); CREATE TABLE b (x UNIQUE)")
        .unwrap();
    let first = run(&conn, "INSERT INTO a VALUES (1)", vec![]).unwrap();
    assert_eq!(first["last_insert_id"], 1);
    let second = run(&conn, "INSERT INTO b VALUES (1)", vec![]).unwrap();
    assert_eq!(second["last_insert_id"], 1);
    let ignored = run(&conn, "INSERT OR IGNORE INTO b VALUES (1)", vec![]).unwrap();
    assert_eq!(ignored["last_insert_id"], serde_json::Value::Null);
    assert_eq!(ignored["rows_affected"], 0);
    let update = run(&conn, "UPDATE a SET x = 2", vec![]).unwrap();
    assert_eq!(update["rows_affected"], 1);
    assert_eq!(update["last_insert_id"], serde_json::Value::Null);
    let upsert = run(
        &conn,
        "INSERT INTO b VALUES (1) ON CONFLICT (x) DO UPDATE SET x = excluded.x",
        vec![],
    )
    .unwrap();
    assert_eq!(upsert["rows_affected"], 1);
    assert_eq!(upsert["last_insert_id"], serde_json::Value::Null);
    let ddl = run(&conn, "CREATE TABLE c (x)", vec![]).unwrap();
    assert_eq!(ddl["rows_affected"], 0);
    let with_select = run(&conn, "WITH t AS (SELECT 1) SELECT * FROM t", vec![]).unwrap();
    assert_eq!(with_select["last_insert_id"], serde_json::Value::Null);
}

#[test]
fn ddl_reports_no_rows_affected_even_when_it_cascades() {
    let conn = conn();
    conn.conn
        .execute_batch(
            "CREATE TABLE p (id INTEGER PRIMARY KEY);
             CREATE TABLE c (p INTEGER REFERENCES p(id) ON DELETE CASCADE);
             INSERT INTO p VALUES (1); INSERT INTO c VALUES (1);",
        )
        .unwrap();
    let dropped = run(&conn, "DROP TABLE p", vec![]).unwrap();
    assert_eq!(dropped["rows_affected"], 0);
}

#[test]
fn parameter_count_is_checked() {
    let err = run(&conn(), "SELECT ?, ?", vec![Param::Null]).unwrap_err();
    assert_eq!(err.code, ErrorCode::SqlError);
    assert!(err.message.contains("takes 2"), "{}", err.message);
}

#[test]
fn exactly_one_statement_however_many_are_sent() {
    let conn = conn();
    for sql in [
        "SELECT 1; SELECT 2",
        "SELECT 1; garbage",
        "SELECT 1;;;;;SELECT 2",
    ] {
        let err = run(&conn, sql, vec![]).unwrap_err();
        assert!(
            err.message.contains("several statements"),
            "{sql}: {}",
            err.message
        );
    }
    assert_eq!(
        run(&conn, "SELECT 1;;; -- done", vec![]).unwrap()["rows"],
        serde_json::json!([[1]])
    );
    for sql in ["", " ;; ", "-- nothing"] {
        assert!(
            run(&conn, sql, vec![])
                .unwrap_err()
                .message
                .contains("no statement"),
            "{sql:?}"
        );
    }
    let many = "SELECT 1;".repeat(50_000);
    let err = run(&conn, &many[..many.len().min(200_000)], vec![]).unwrap_err();
    assert_eq!(err.code, ErrorCode::SqlError);
}

#[test]
fn the_sandbox_names_what_it_refused() {
    let conn = conn();
    let err = run(&conn, "ATTACH '/tmp/elsewhere.db' AS x", vec![]).unwrap_err();
    assert_eq!(err.code, ErrorCode::StatementNotAllowed);
    assert!(err.message.contains("ATTACH"), "{}", err.message);
    let err = run(&conn, "PRAGMA foreign_keys = OFF", vec![]).unwrap_err();
    assert_eq!(err.code, ErrorCode::StatementNotAllowed);
    assert!(err.message.contains("foreign_keys"), "{}", err.message);
    let err = run(&conn, "SELECT * FROM temp._sqlhttp_rowid_probe", vec![]).unwrap_err();
    assert_eq!(err.code, ErrorCode::StatementNotAllowed);
    let fk: i64 = conn
        .conn
        .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
        .unwrap();
    assert_eq!(fk, 1);
}

#[test]
fn values_and_results_are_bounded() {
    let conn = conn_with(Limits {
        max_value_bytes: 1000,
        max_result_bytes: 10_000,
        ..Limits::default()
    });
    let err = run(&conn, "SELECT zeroblob(300000000)", vec![]).unwrap_err();
    assert_eq!(err.code, ErrorCode::SqlError);
    assert!(err.message.contains("--max-value-bytes"), "{}", err.message);
    let err = run(&conn, "SELECT ?", vec![Param::Text("x".repeat(1001))]).unwrap_err();
    assert_eq!(err.code, ErrorCode::SqlError);
    let err = run(
        &conn,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
        vec![],
    )
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::ResultTooLarge);
    assert!(err.message.contains("10000"), "{}", err.message);
}

/// Pieces that stress a SQL front end: nesting, statement separators, unterminated
/// comments and literals, NULs, long identifiers, keywords of every class.
fn adversarial_sql() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let piece = prop_oneof![
        Just("(".to_owned()),
        Just(")".to_owned()),
        Just(";".to_owned()),
        Just("'".to_owned()),
        Just("\"".to_owned()),
        Just("/*".to_owned()),
        Just("*/".to_owned()),
        Just("--".to_owned()),
        Just("\n".to_owned()),
        Just("\0".to_owned()),
        Just("SELECT 1".to_owned()),
        Just("END".to_owned()),
        Just("BEGIN".to_owned()),
        Just("CASE WHEN 1 THEN".to_owned()),
        Just("ATTACH 'x' AS y".to_owned()),
        Just("PRAGMA foreign_keys=OFF".to_owned()),
        Just("_sqlhttp_idempotency".to_owned()),
        Just("zeroblob(999999999)".to_owned()),
        "[a-z_]{1,8}".prop_map(|s| s),
        "x{200,2000}".prop_map(|s| s),
    ];
    (proptest::collection::vec(piece, 0..64), 1usize..400)
        .prop_map(|(pieces, times)| pieces.concat().repeat(times))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever the text, the statement check answers (a body or a typed error), never
    /// panics or overflows the stack, and leaves no transaction open.
    #[test]
    fn any_text_gets_an_answer(sql in adversarial_sql()) {
        let conn = conn();
        let request = SqlRequest {
            sql,
            params: vec![],
            read_only: false,
        };
        let _ = execute(&conn, &request, Access::ReadWrite);
        proptest::prop_assert!(conn.conn.is_autocommit());
        let fk: i64 = conn.conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0)).unwrap();
        proptest::prop_assert_eq!(fk, 1);
    }
}
