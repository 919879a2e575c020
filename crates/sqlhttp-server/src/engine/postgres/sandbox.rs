//! What PostgreSQL adds to the common sandbox (`engine::sandbox::check_text`): the statements
//! that would change the server's session (role, settings, prepared statements, transactions)
//! are refused before they reach PostgreSQL, with a message saying why.
//!
//! A courtesy, not the boundary: a client's function can still run what this module refuses.
//! The boundary is the login: client statements log in as the client role (see `setup`), which
//! has no privilege on the server's store, no superuser rights and so no server-file functions
//! (`COPY ... TO/FROM` a file or `PROGRAM`, `pg_read_file`, `lo_import`: all `42501`, answered
//! `403 STATEMENT_NOT_ALLOWED`), and a session a function changes is reset before the next
//! request (see `docs/adr/0020-postgresql-client-login.md`). Pure text checks; knows nothing
//! about connections.

use crate::api_error::ApiError;
use crate::request::leading_keyword;

/// Leading keywords a client statement may not have, and why.
const REFUSED: &[(&str, &str)] = &[
    (
        "SET",
        "SET is not allowed: the server's session settings (role, statement_timeout) are its own",
    ),
    (
        "RESET",
        "RESET is not allowed: the server's session settings are its own",
    ),
    (
        "DISCARD",
        "DISCARD is not allowed: connections are the server's",
    ),
    (
        "DO",
        "DO blocks are not allowed: send the statements, or a batch (POST /api/v1/batch)",
    ),
    (
        "LISTEN",
        "LISTEN and NOTIFY are not available: a request's connection is not kept",
    ),
    (
        "UNLISTEN",
        "LISTEN and NOTIFY are not available: a request's connection is not kept",
    ),
    ("START", crate::engine::sandbox::TRANSACTION_HINT),
    ("ABORT", crate::engine::sandbox::TRANSACTION_HINT),
    (
        "PREPARE",
        "PREPARE is not allowed: every request is prepared by the server",
    ),
    (
        "EXECUTE",
        "EXECUTE is not allowed: every request is prepared by the server",
    ),
    (
        "DEALLOCATE",
        "DEALLOCATE is not allowed: every request is prepared by the server",
    ),
];

/// Functions that change session settings, refused wherever they appear in the text.
const REFUSED_FUNCTIONS: &[&str] = &["set_config"];

/// Checks a client's SQL text for PostgreSQL, after `engine::sandbox::check_text`.
pub(crate) fn check_text(sql: &str) -> Result<(), ApiError> {
    let keyword = leading_keyword(sql);
    if let Some((_, why)) = REFUSED.iter().find(|(refused, _)| *refused == keyword) {
        return Err(ApiError::not_allowed(*why));
    }
    let lower = sql.to_ascii_lowercase();
    if let Some(function) = REFUSED_FUNCTIONS.iter().find(|f| lower.contains(*f)) {
        return Err(ApiError::not_allowed(format!(
            "{function} is not allowed: the server's session settings are its own"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_error::ErrorCode;

    #[test]
    fn role_and_session_changes_are_refused() {
        for sql in [
            "SET ROLE postgres",
            "reset role",
            "RESET ALL",
            "SET SESSION AUTHORIZATION postgres",
            "set statement_timeout = 0",
            "/* hi */ SET LOCAL role postgres",
            "SELECT set_config('role', 'postgres', false)",
            "SELECT SET_CONFIG('role', 'postgres', true)",
            "DO $$ BEGIN RESET ROLE; END $$",
            "START TRANSACTION",
            "ABORT",
            "PREPARE p AS SELECT 1",
            "DISCARD ALL",
            "LISTEN x",
        ] {
            let err = check_text(sql).unwrap_err();
            assert_eq!(err.code, ErrorCode::StatementNotAllowed, "{sql}");
        }
    }

    #[test]
    fn ordinary_statements_pass() {
        for sql in [
            "SELECT 1",
            "UPDATE t SET x = 1",
            "INSERT INTO settings (k) VALUES ('role')",
            "CREATE TABLE t (id bigint PRIMARY KEY)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
        ] {
            check_text(sql).unwrap();
        }
    }
}
