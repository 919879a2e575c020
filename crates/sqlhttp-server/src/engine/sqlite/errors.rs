//! Mapping engine (rusqlite) errors onto the protocol's error table.
//!
//! Knows rusqlite's error types and the protocol's codes, nothing about HTTP plumbing or
//! idempotency. Details of unexpected errors are logged here and never sent to the client.

use rusqlite::ErrorCode as Code;

use crate::protocol::error::{ApiError, ConstraintKind};

/// The protocol error for an engine failure.
pub(crate) fn map_engine_error(err: rusqlite::Error) -> ApiError {
    use rusqlite::Error as E;
    match err {
        E::SqliteFailure(failure, msg) => map_failure(failure, msg),
        E::SqlInputError { error, msg, .. } => map_failure(error, Some(msg)),
        E::MultipleStatement => ApiError::sql(
            "the SQL text contains several statements; send exactly one statement per request",
        ),
        E::Empty => ApiError::sql("the SQL text contains no statement"),
        E::InvalidParameterCount(given, expected) => ApiError::sql(format!(
            "wrong number of parameters: the statement takes {expected}, the request gave {given}"
        )),
        E::NulError(_) => ApiError::sql("the SQL text contains a NUL character"),
        E::InvalidParameterName(name) => ApiError::sql(format!("invalid parameter name {name}")),
        other => {
            tracing::error!(error = %other, "unexpected engine error");
            ApiError::internal()
        }
    }
}

fn map_failure(failure: rusqlite::ffi::Error, msg: Option<String>) -> ApiError {
    let message = msg.unwrap_or_else(|| failure.to_string());
    match failure.code {
        // A STRICT table's type check is a type error, not one of the protocol's constraint
        // violations (unique, primary key, check, foreign key, not-null).
        Code::ConstraintViolation
            if failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_DATATYPE =>
        {
            ApiError::sql(message)
        }
        Code::ConstraintViolation => {
            ApiError::constraint(constraint_kind(failure.extended_code), message)
        }
        Code::DatabaseBusy | Code::DatabaseLocked | Code::SchemaChanged => {
            ApiError::unavailable(format!("the database is busy, retry later ({message})"))
        }
        Code::OperationInterrupted => ApiError::interrupted(),
        // SQLite's connections together reached the engine's memory limit: this statement's
        // sort, DISTINCT or value, or others running beside it. Its work was rolled back.
        Code::OutOfMemory => ApiError::unavailable(
            "the statement needs more memory than this server lets its engine use at once \
             (--max-engine-memory), counting the statements beside it; nothing it wrote was \
             kept. Retry later, or make it use less (a smaller sort, DISTINCT or value)",
        ),
        // The sandbox's authorizer refused part of the statement; the engine replaces this
        // message with the sandbox's reason.
        Code::AuthorizationForStatementDenied => ApiError::not_allowed(message),
        // The engine's verdict on the statement itself: syntax, unknown names, types, sizes,
        // writes to a read-only database.
        Code::Unknown
        | Code::TypeMismatch
        | Code::ParameterOutOfRange
        | Code::TooBig
        | Code::ReadOnly => ApiError::sql(message),
        _ => {
            tracing::error!(
                code = ?failure.code,
                extended_code = failure.extended_code,
                message = %message,
                "engine failure"
            );
            ApiError::internal()
        }
    }
}

/// The protocol's name for a constraint, from SQLite's extended result code.
fn constraint_kind(extended_code: i32) -> Option<ConstraintKind> {
    use rusqlite::ffi;
    match extended_code {
        ffi::SQLITE_CONSTRAINT_UNIQUE => Some(ConstraintKind::Unique),
        ffi::SQLITE_CONSTRAINT_PRIMARYKEY | ffi::SQLITE_CONSTRAINT_ROWID => {
            Some(ConstraintKind::PrimaryKey)
        }
        ffi::SQLITE_CONSTRAINT_FOREIGNKEY => Some(ConstraintKind::ForeignKey),
        ffi::SQLITE_CONSTRAINT_CHECK => Some(ConstraintKind::Check),
        ffi::SQLITE_CONSTRAINT_NOTNULL => Some(ConstraintKind::NotNull),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::ErrorCode;
    use rusqlite::Connection;

    fn error_of(conn: &Connection, sql: &str) -> ApiError {
        map_engine_error(conn.execute_batch(sql).unwrap_err())
    }

    #[test]
    fn engine_verdicts_map_to_the_table() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .unwrap();
        let syntax = error_of(&conn, "SELEC 1");
        assert_eq!(syntax.code, ErrorCode::SqlError);
        assert!(
            syntax.message.contains("syntax error"),
            "{}",
            syntax.message
        );
        assert_eq!(
            error_of(&conn, "SELECT * FROM nope").code,
            ErrorCode::SqlError
        );
        let not_null = error_of(&conn, "INSERT INTO t (v) VALUES (NULL)");
        assert_eq!(not_null.code, ErrorCode::ConstraintViolation);
        assert!(
            not_null.message.contains("NOT NULL"),
            "{}",
            not_null.message
        );
        assert_eq!(not_null.constraint, Some(ConstraintKind::NotNull));
        conn.execute_batch("CREATE TABLE s (x INTEGER) STRICT")
            .unwrap();
        let strict = error_of(&conn, "INSERT INTO s VALUES ('abc')");
        assert_eq!(strict.code, ErrorCode::SqlError);
        assert!(
            strict.message.contains("cannot store"),
            "{}",
            strict.message
        );
    }

    #[test]
    fn every_constraint_names_its_kind() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "PRAGMA foreign_keys = ON;
             CREATE TABLE p (id INTEGER PRIMARY KEY, code TEXT UNIQUE, n INTEGER CHECK (n > 0),
                             v TEXT NOT NULL);
             CREATE TABLE k (a TEXT PRIMARY KEY, b TEXT) WITHOUT ROWID;
             CREATE TABLE c (p INTEGER REFERENCES p(id));
             INSERT INTO p VALUES (1, 'a', 1, 'x'); INSERT INTO k VALUES ('a', 'b');",
        )
        .unwrap();
        let cases = [
            (
                "INSERT INTO p VALUES (1, 'b', 1, 'x')",
                ConstraintKind::PrimaryKey,
            ),
            (
                "INSERT INTO k VALUES ('a', 'c')",
                ConstraintKind::PrimaryKey,
            ),
            (
                "INSERT INTO p VALUES (2, 'a', 1, 'x')",
                ConstraintKind::Unique,
            ),
            (
                "INSERT INTO p VALUES (2, 'b', 0, 'x')",
                ConstraintKind::Check,
            ),
            (
                "INSERT INTO p VALUES (2, 'b', 1, NULL)",
                ConstraintKind::NotNull,
            ),
            ("INSERT INTO c VALUES (99)", ConstraintKind::ForeignKey),
        ];
        for (sql, kind) in cases {
            let err = error_of(&conn, sql);
            assert_eq!(err.code, ErrorCode::ConstraintViolation, "{sql}");
            assert_eq!(err.constraint, Some(kind), "{sql}: {}", err.message);
        }
    }

    #[test]
    fn rusqlite_level_errors() {
        assert_eq!(
            map_engine_error(rusqlite::Error::MultipleStatement).code,
            ErrorCode::SqlError
        );
        assert_eq!(
            map_engine_error(rusqlite::Error::Empty).code,
            ErrorCode::SqlError
        );
        assert_eq!(
            map_engine_error(rusqlite::Error::InvalidParameterCount(1, 2)).code,
            ErrorCode::SqlError
        );
        assert_eq!(
            map_engine_error(rusqlite::Error::InvalidQuery).code,
            ErrorCode::Internal
        );
    }

    #[test]
    fn busy_and_io_failures() {
        let failure = |code| {
            map_engine_error(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                Some("detail".into()),
            ))
        };
        assert_eq!(
            failure(rusqlite::ffi::SQLITE_BUSY).code,
            ErrorCode::Unavailable
        );
        assert_eq!(
            failure(rusqlite::ffi::SQLITE_LOCKED).code,
            ErrorCode::Unavailable
        );
        let interrupted = failure(rusqlite::ffi::SQLITE_INTERRUPT);
        assert_eq!(interrupted.code, ErrorCode::Unavailable);
        assert!(interrupted.interrupted);
        assert_eq!(
            failure(rusqlite::ffi::SQLITE_AUTH).code,
            ErrorCode::StatementNotAllowed
        );
        let io = failure(rusqlite::ffi::SQLITE_IOERR);
        assert_eq!(io.code, ErrorCode::Internal);
        assert!(
            !io.message.contains("detail"),
            "internal details must not leak"
        );
        assert_eq!(
            failure(rusqlite::ffi::SQLITE_CORRUPT).code,
            ErrorCode::Internal
        );
    }
}
