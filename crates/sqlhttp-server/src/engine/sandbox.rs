//! The sandbox rules both engines share, read from a statement's text before any engine sees
//! it: size (`--max-sql-bytes`), NUL characters, transaction control (refused: each request is
//! its own transaction) and `VACUUM` (`VACUUM INTO` writes a copy of the database to a path of
//! the client's choosing), each statement's keywords read by `sql_text` as both engines read
//! them (ADR 0027: `;COMMIT` is a COMMIT to both).
//!
//! [`check_text`] runs once per statement, at admission (`http::admit`); what each engine adds
//! is in its own `sandbox` module (`sqlite::sandbox`: the authorizer and the schema checks;
//! `postgres::sandbox`: PostgreSQL's statements). Knows the protocol's error codes; nothing
//! about HTTP or either engine. See `docs/adr/0012-statement-sandbox.md`.

use crate::config::Limits;
use crate::engine::sql_text::{TRANSACTION_CONTROL, leading};
use crate::protocol::error::{ApiError, ErrorCode};

/// How to do atomic multi-statement work, for every refusal of transaction control.
pub(crate) const TRANSACTION_HINT: &str = "transaction-control statements (BEGIN, COMMIT, END, \
ROLLBACK, SAVEPOINT, RELEASE) are not accepted: every request runs as its own transaction. \
For several statements that must apply together, send them as one atomic batch \
(POST /api/v1/batch)";

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
    // One reading of the text for both refusals: transaction control, and VACUUM.
    const REFUSED: [&str; 7] = {
        let [a, b, c, d, e, f] = TRANSACTION_CONTROL;
        [a, b, c, d, e, f, "VACUUM"]
    };
    match leading(sql, &REFUSED) {
        None => Ok(()),
        Some("VACUUM") => Err(ApiError::not_allowed(
            "VACUUM is not allowed: the database file is the server's to maintain, \
             and VACUUM INTO would write a copy of it outside the served database",
        )),
        Some(_) => Err(ApiError::bad_request(TRANSACTION_HINT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
