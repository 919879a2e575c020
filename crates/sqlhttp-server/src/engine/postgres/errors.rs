//! PostgreSQL's SQLSTATE codes mapped onto the protocol's error table, in ONE table
//! ([`TABLE`]): an exact code wins over its two-character class, and a code in neither is an
//! `INTERNAL` error whose details go to the log only.
//!
//! A code the client's own code raised (PL/pgSQL `RAISE ... USING ERRCODE`, which PostgreSQL
//! reports from its `exec_stmt_raise` routine, a field `RAISE` cannot set) is the client's
//! error whatever its class: a verdict that would blame the server or promise a retry
//! (`503`, `500`, `422 STATEMENT_TIMEOUT`) becomes `400 SQL_ERROR` (see [`raised_verdict`] and
//! `docs/adr/0028-postgresql-answers-and-bounded-cells.md`).
//!
//! Knows SQLSTATE codes, the two drivers' error types (tokio-postgres's and `sqlhttp-pgwire`'s,
//! both read through [`Reported`]) and the protocol's codes; nothing about connections,
//! transactions or HTTP. The engine adds what only it knows (the statement
//! timeout's length, the batch statement's index).

/// An error PostgreSQL reported, as either driver hands it over: the fields the mapping reads.
pub(crate) trait Reported {
    /// The SQLSTATE code.
    fn code(&self) -> &str;
    /// The primary message.
    fn message(&self) -> &str;
    /// The routine in PostgreSQL's source that reported it.
    fn routine(&self) -> Option<&str>;
    /// The constraint it is about.
    fn constraint(&self) -> Option<&str>;
}

impl Reported for tokio_postgres::error::DbError {
    fn code(&self) -> &str {
        tokio_postgres::error::DbError::code(self).code()
    }
    fn message(&self) -> &str {
        tokio_postgres::error::DbError::message(self)
    }
    fn routine(&self) -> Option<&str> {
        tokio_postgres::error::DbError::routine(self)
    }
    fn constraint(&self) -> Option<&str> {
        tokio_postgres::error::DbError::constraint(self)
    }
}

impl Reported for sqlhttp_pgwire::DbError {
    fn code(&self) -> &str {
        &self.code
    }
    fn message(&self) -> &str {
        &self.message
    }
    fn routine(&self) -> Option<&str> {
        self.routine.as_deref()
    }
    fn constraint(&self) -> Option<&str> {
        self.constraint.as_deref()
    }
}

use crate::protocol::error::{ApiError, ConstraintKind, ErrorCode};

/// What the protocol makes of a SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// `409 CONSTRAINT_VIOLATION`, naming the constraint's kind.
    Constraint(ConstraintKind),
    /// `503 UNAVAILABLE` with `Retry-After`: the same request may succeed when sent again
    /// (serialization failure, deadlock, lock timeout, too many connections).
    Retry,
    /// `422 STATEMENT_TIMEOUT`: `statement_timeout` cancelled the statement.
    Timeout,
    /// `503 UNAVAILABLE`: the connection was lost or the database is shutting down.
    Unavailable,
    /// `400 SQL_ERROR`: the statement's own fault (syntax, names, types, data).
    Sql,
    /// `403 STATEMENT_NOT_ALLOWED`: the client's role lacks a privilege.
    NotAllowed,
    /// `403 READ_ONLY`: a write in a read-only transaction.
    ReadOnly,
    /// `500 INTERNAL`: the server's fault or an unknown condition; logged, not told.
    Internal,
}

/// The mapping: exact five-character codes first, then two-character classes.
pub(crate) const TABLE: &[(&str, Verdict)] = &[
    // Class 23: integrity constraint violation.
    ("23505", Verdict::Constraint(ConstraintKind::Unique)),
    ("23503", Verdict::Constraint(ConstraintKind::ForeignKey)),
    ("23502", Verdict::Constraint(ConstraintKind::NotNull)),
    ("23514", Verdict::Constraint(ConstraintKind::Check)),
    ("23P01", Verdict::Constraint(ConstraintKind::Exclusion)),
    ("23001", Verdict::Constraint(ConstraintKind::ForeignKey)), // restrict_violation
    ("23000", Verdict::Sql),                                    // integrity_constraint_violation
    // Class 40: transaction rollback; the same request may succeed when sent again.
    ("40001", Verdict::Retry), // serialization_failure
    ("40P01", Verdict::Retry), // deadlock_detected
    ("55P03", Verdict::Retry), // lock_not_available (lock_timeout)
    ("53300", Verdict::Retry), // too_many_connections
    // configuration_limit_exceeded: "temporary file size exceeds temp_file_limit", the
    // statement's own size (ADR 0029); sending it again fails the same way.
    ("53400", Verdict::Sql),
    // Class 57: operator intervention.
    ("57014", Verdict::Timeout),     // query_canceled (statement_timeout)
    ("57P01", Verdict::Unavailable), // admin_shutdown
    ("57P02", Verdict::Unavailable), // crash_shutdown
    ("57P03", Verdict::Unavailable), // cannot_connect_now
    ("57P04", Verdict::Unavailable), // database_dropped
    ("57P05", Verdict::Unavailable), // idle_session_timeout
    // Privileges and read-only transactions.
    ("42501", Verdict::NotAllowed), // insufficient_privilege
    ("25006", Verdict::ReadOnly),   // read_only_sql_transaction
    // Errors of the transaction's state: a statement tried to end or nest one.
    ("25001", Verdict::Sql), // active_sql_transaction
    ("25P01", Verdict::Sql), // no_active_sql_transaction
    ("0A000", Verdict::Sql), // feature_not_supported
    ("0B000", Verdict::Sql), // invalid_transaction_initiation
    ("2D000", Verdict::Sql), // invalid_transaction_termination (COMMIT in a called procedure)
    // Classes.
    ("08", Verdict::Unavailable), // connection exception
    ("53", Verdict::Unavailable), // insufficient resources (disk full, out of memory)
    ("40", Verdict::Retry),       // transaction rollback
    ("22", Verdict::Sql),         // data exception (bad input, overflow, division by zero)
    ("42", Verdict::Sql),         // syntax error or access rule violation
    ("21", Verdict::Sql),         // cardinality violation
    ("23", Verdict::Sql),         // other integrity violations
    ("26", Verdict::Sql),         // invalid SQL statement name
    ("2B", Verdict::Sql),         // dependent privilege descriptors still exist
    ("34", Verdict::Sql),         // invalid cursor name
    ("3D", Verdict::Sql),         // invalid catalog name
    ("3F", Verdict::Sql),         // invalid schema name
    ("44", Verdict::Sql),         // WITH CHECK OPTION violation
    ("P0", Verdict::Sql),         // PL/pgSQL raise_exception and friends
    ("2F", Verdict::Sql),         // SQL routine exception
    ("38", Verdict::Sql),         // external routine exception
    ("39", Verdict::Sql),         // external routine invocation exception
    ("54", Verdict::Sql),         // program limit exceeded (too many columns, too complex)
    ("55", Verdict::Sql),         // object not in prerequisite state
    ("09", Verdict::Sql),         // triggered action exception
    // Classes a client's own code can raise (or cause): its errors, not the server's.
    ("20", Verdict::Sql),        // case not found (PL/pgSQL CASE)
    ("24", Verdict::Sql),        // invalid cursor state
    ("25", Verdict::Sql),        // invalid transaction state
    ("27", Verdict::Sql),        // triggered data change violation
    ("0F", Verdict::Sql),        // locator exception
    ("0Z", Verdict::Sql),        // diagnostics exception
    ("10", Verdict::Sql),        // XQuery error
    ("3B", Verdict::Sql),        // savepoint exception
    ("HV", Verdict::Sql),        // foreign data wrapper error
    ("72", Verdict::Sql),        // snapshot failure
    ("0L", Verdict::NotAllowed), // invalid grantor
    ("0P", Verdict::NotAllowed), // invalid role specification
    ("28", Verdict::NotAllowed), // invalid authorization specification
    ("58", Verdict::Internal),   // system error (I/O)
    ("XX", Verdict::Internal),   // internal error
    ("F0", Verdict::Internal),   // configuration file error
];

/// The verdict for a SQLSTATE code.
pub(crate) fn verdict(code: &str) -> Verdict {
    let exact = TABLE.iter().find(|(entry, _)| *entry == code);
    let class = || {
        TABLE
            .iter()
            .find(|(entry, _)| entry.len() == 2 && code.get(..2) == Some(*entry))
    };
    exact.or_else(class).map_or(Verdict::Internal, |(_, v)| *v)
}

/// The verdict for a code the client's own code raised: constraint, SQL and privilege
/// verdicts stand (they already blame the statement); any other is the statement's
/// `SQL_ERROR`. A raised `40001` is not a serialization failure the server may retry, nor is a
/// raised `XX000` the server's fault.
pub(crate) fn raised_verdict(code: &str) -> Verdict {
    match verdict(code) {
        verdict @ (Verdict::Constraint(_) | Verdict::Sql | Verdict::NotAllowed) => verdict,
        Verdict::Retry
        | Verdict::Timeout
        | Verdict::Unavailable
        | Verdict::ReadOnly
        | Verdict::Internal => Verdict::Sql,
    }
}

/// `too_many_connections`: the one unavailability that is load, not an outage.
const TOO_MANY_CONNECTIONS: &str = "53300";

/// PostgreSQL's routine that reports PL/pgSQL's `RAISE`. `RAISE;` in a handler re-throws the
/// caught error with its own routine, so a real serialization failure passed on stays one.
const RAISE_ROUTINE: &str = "exec_stmt_raise";

/// Whether the client's own code raised `db` (see the module documentation).
pub(crate) fn is_raised(db: &impl Reported) -> bool {
    db.routine() == Some(RAISE_ROUTINE)
}

/// The protocol error for a failed PostgreSQL call. `timeout_ms` is the statement timeout in
/// force, named in a `STATEMENT_TIMEOUT` message.
pub(crate) fn map_error(err: &tokio_postgres::Error, timeout_ms: u128) -> ApiError {
    match err.as_db_error() {
        Some(db) => map_db_error(db, timeout_ms),
        None if err.is_closed() => {
            ApiError::outage("the connection to the database was lost; retry later")
        }
        None => {
            // I/O, protocol or conversion failures: the server's side, not the statement's.
            tracing::warn!(error = %err, "database call failed");
            ApiError::outage("the database did not answer; retry later")
        }
    }
}

/// Longest message passed on: a function may raise one of a gigabyte, and a keyed request's
/// error is stored.
const MAX_MESSAGE_BYTES: usize = 4096;

/// `message`, cut at a character boundary to [`MAX_MESSAGE_BYTES`] with a note that it was.
pub(crate) fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... (cut from {} bytes)", &message[..end], message.len())
}

/// The protocol error for an error PostgreSQL reported.
pub(crate) fn map_db_error(db: &impl Reported, timeout_ms: u128) -> ApiError {
    let code = db.code();
    // PostgreSQL's detail quotes values (`Key (email)=(a@example.com) already exists`), and no
    // error body carries a bound value or a cell: the message alone goes to the client.
    let mut message = bounded(db.message());
    let verdict = if is_raised(db) {
        let raised = raised_verdict(code);
        if raised != verdict(code) {
            // The code is the client's to read: it says what its own code meant.
            message = format!("{message} (SQLSTATE {code}, raised by the statement's own code)");
        }
        raised
    } else {
        verdict(code)
    };
    match verdict {
        Verdict::Constraint(kind) => {
            // PostgreSQL names a primary key's index `<table>_pkey` unless told otherwise.
            let kind = match (kind, db.constraint()) {
                (ConstraintKind::Unique, Some(name)) if name.ends_with("_pkey") => {
                    ConstraintKind::PrimaryKey
                }
                (kind, _) => kind,
            };
            ApiError::constraint(Some(kind), message)
        }
        Verdict::Retry => ApiError::unavailable(format!(
            "the database could not complete the statement now, retry later ({message})"
        )),
        Verdict::Timeout => ApiError::new(
            ErrorCode::StatementTimeout,
            format!(
                "the statement ran longer than this server's limit of {timeout_ms} ms \
                 (--statement-timeout) and was cancelled; nothing it did was kept"
            ),
        ),
        // Too many connections is load; the rest of the class (shutdown, a lost connection,
        // disk or memory exhausted) is an outage, answered without `Retry-After`.
        Verdict::Unavailable if code == TOO_MANY_CONNECTIONS => ApiError::unavailable(format!(
            "the database is unavailable, retry later ({message})"
        )),
        Verdict::Unavailable => ApiError::outage(format!(
            "the database is unavailable, retry later ({message})"
        )),
        Verdict::Sql => ApiError::sql(message),
        Verdict::NotAllowed => ApiError::not_allowed(format!(
            "{message}: statements run as the server's client role, which has no access to this"
        )),
        Verdict::ReadOnly => ApiError::new(
            ErrorCode::ReadOnly,
            format!("{message}: this request may only read; nothing was written"),
        ),
        Verdict::Internal => {
            tracing::error!(sqlstate = code, message = %message, "database failure");
            ApiError::internal()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_brief() {
        let rows = [
            ("23505", ErrorCode::ConstraintViolation, Some("unique")),
            ("23503", ErrorCode::ConstraintViolation, Some("foreign_key")),
            ("23502", ErrorCode::ConstraintViolation, Some("not_null")),
            ("23514", ErrorCode::ConstraintViolation, Some("check")),
            ("23P01", ErrorCode::ConstraintViolation, Some("exclusion")),
            ("40001", ErrorCode::Unavailable, None),
            ("40P01", ErrorCode::Unavailable, None),
            ("40002", ErrorCode::Unavailable, None),
            ("55P03", ErrorCode::Unavailable, None),
            ("53300", ErrorCode::Unavailable, None),
            ("57014", ErrorCode::StatementTimeout, None),
            ("08006", ErrorCode::Unavailable, None),
            ("08000", ErrorCode::Unavailable, None),
            ("57P01", ErrorCode::Unavailable, None),
            ("57P02", ErrorCode::Unavailable, None),
            ("57P03", ErrorCode::Unavailable, None),
            ("53100", ErrorCode::Unavailable, None),
            ("53400", ErrorCode::SqlError, None),
            ("42601", ErrorCode::SqlError, None),
            ("42P01", ErrorCode::SqlError, None),
            ("42703", ErrorCode::SqlError, None),
            ("42883", ErrorCode::SqlError, None),
            ("22P02", ErrorCode::SqlError, None),
            ("22012", ErrorCode::SqlError, None),
            ("22003", ErrorCode::SqlError, None),
            ("25001", ErrorCode::SqlError, None),
            ("0A000", ErrorCode::SqlError, None),
            ("P0001", ErrorCode::SqlError, None),
            ("42501", ErrorCode::StatementNotAllowed, None),
            ("25006", ErrorCode::ReadOnly, None),
            ("XX000", ErrorCode::Internal, None),
            ("58030", ErrorCode::Internal, None),
            ("ZZ999", ErrorCode::Internal, None),
        ];
        for (code, expected, kind) in rows {
            let err = match verdict(code) {
                Verdict::Constraint(kind) => ApiError::constraint(Some(kind), "m"),
                Verdict::Retry | Verdict::Unavailable => ApiError::unavailable("m"),
                Verdict::Timeout => ApiError::new(ErrorCode::StatementTimeout, "m"),
                Verdict::Sql => ApiError::sql("m"),
                Verdict::NotAllowed => ApiError::not_allowed("m"),
                Verdict::ReadOnly => ApiError::new(ErrorCode::ReadOnly, "m"),
                Verdict::Internal => ApiError::internal(),
            };
            assert_eq!(err.code, expected, "{code}");
            assert_eq!(err.constraint.map(ConstraintKind::as_str), kind, "{code}");
        }
    }

    #[test]
    fn raised_codes_are_the_clients_errors() {
        for code in [
            "40001", "40P01", "08006", "57000", "57014", "57P01", "XX000", "53100", "25006",
            "58030", "ZZ999",
        ] {
            assert_eq!(raised_verdict(code), Verdict::Sql, "{code}");
        }
        assert_eq!(raised_verdict("P0001"), Verdict::Sql);
        assert_eq!(raised_verdict("22012"), Verdict::Sql);
        assert_eq!(raised_verdict("42501"), Verdict::NotAllowed);
        assert_eq!(
            raised_verdict("23505"),
            Verdict::Constraint(ConstraintKind::Unique)
        );
    }

    #[test]
    fn exact_codes_win_over_their_class() {
        assert_eq!(verdict("42501"), Verdict::NotAllowed);
        assert_eq!(verdict("42000"), Verdict::Sql);
        assert_eq!(verdict("23000"), Verdict::Sql);
        assert_eq!(verdict(""), Verdict::Internal);
        assert_eq!(verdict("4"), Verdict::Internal);
    }

    #[test]
    fn every_entry_is_a_code_or_a_class_and_appears_once() {
        for (index, (entry, _)) in TABLE.iter().enumerate() {
            assert!(entry.len() == 5 || entry.len() == 2, "{entry}");
            assert!(
                entry
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()),
                "{entry}"
            );
            assert!(
                TABLE[index + 1..].iter().all(|(other, _)| other != entry),
                "{entry} twice"
            );
        }
    }
}
