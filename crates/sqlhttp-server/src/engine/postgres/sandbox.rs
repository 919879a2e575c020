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

use crate::engine::sql_text::{self, leading};
use crate::protocol::error::ApiError;

/// Why cursors are refused.
const CURSOR_HINT: &str =
    "cursors are not available: a request's connection is not kept, and its rows stream anyway";

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
    ("DECLARE", CURSOR_HINT),
    ("FETCH", CURSOR_HINT),
    ("MOVE", CURSOR_HINT),
    ("CLOSE", CURSOR_HINT),
    (
        "DEALLOCATE",
        "DEALLOCATE is not allowed: every request is prepared by the server",
    ),
    ("COPY", COPY_HINT),
];

/// Why `COPY` is refused, and how to bulk load instead. `COPY ... TO STDOUT` / `FROM STDIN`
/// would switch the connection into the copy protocol, which an HTTP request cannot drive; to or
/// from a file or a program it needs rights the client role does not have. A client's function
/// cannot reach the client's copy either: PL/pgSQL and SQL functions refuse `COPY` to or from
/// the client (`0A000`).
pub(crate) const COPY_HINT: &str = "COPY to or from the client is not available over HTTP: \
to bulk load rows, use the SDK's Client::insert (atomic batches of INSERTs) or the CLI's \
`sqlhttp import` (CSV or NDJSON); to read rows out, SELECT them (large results stream)";

/// Objects `ALTER` may not change: the client role's own password and settings (a role may
/// alter itself) are the server's.
const REFUSED_ALTER: &[&str] = &["ROLE", "USER", "GROUP", "SYSTEM", "DATABASE"];

/// Functions that change session settings, refused wherever they appear in the text.
const REFUSED_FUNCTIONS: &[&str] = &["set_config"];

/// Checks a client's SQL text for PostgreSQL, after `engine::sandbox::check_text`. A text with
/// no statement (blank, comments, `;`) is refused as SQLite refuses it: PostgreSQL would run it
/// as an empty query and answer an empty success.
pub(crate) fn check_text(sql: &str) -> Result<(), ApiError> {
    if sql_text::statement(sql, sql_text::Dialect::Postgres).is_none() {
        return Err(ApiError::sql("the SQL text contains no statement"));
    }
    for statement in sql_text::readings(sql) {
        if let Some((_, why)) = REFUSED
            .iter()
            .find(|(refused, _)| *refused == statement.first)
        {
            return Err(ApiError::not_allowed(*why));
        }
        if statement.first == "ALTER" && REFUSED_ALTER.contains(&statement.second.as_str()) {
            return Err(ApiError::not_allowed(format!(
                "ALTER {} is not allowed: roles and the database's settings are the server's",
                statement.second
            )));
        }
    }
    let lower = sql.to_ascii_lowercase();
    // Under both readings of a backslash in a plain string literal: refusing more than
    // PostgreSQL would run is safe, missing what it runs is not.
    let code = [
        outside_string_literals(&lower, false),
        outside_string_literals(&lower, true),
    ];
    if let Some(function) = REFUSED_FUNCTIONS
        .iter()
        .find(|f| code.iter().any(|code| code.contains(*f)))
    {
        return Err(ApiError::not_allowed(format!(
            "{function} is not allowed: the server's session settings are its own"
        )));
    }
    if lower.contains("u&\"") {
        // U&"set\005fconfig" names set_config without spelling it.
        return Err(ApiError::not_allowed(
            "Unicode-escaped identifiers (U&\"...\") are not accepted: write the name itself",
        ));
    }
    Ok(())
}

/// `sql` with the body of each single-quoted string literal blanked, so a function named
/// inside data (`'dataset_configuration'`) is not taken for a call. Everything else is kept as
/// it is, so a name is still found in identifiers, comments and dollar-quoted bodies (a
/// function's body runs later): each of those is skipped whole only so that a quote inside it
/// does not open a literal. A literal's backslashes escape when it is an `E'...'` string, or
/// everywhere when `backslash_escapes` (`standard_conforming_strings` off, which no session of
/// this server has: read both ways by the caller).
fn outside_string_literals(sql: &str, backslash_escapes: bool) -> String {
    let bytes = sql.as_bytes();
    let mut kept = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let byte = bytes[i];
        let after_ident = i > 0 && sql_text::is_ident_char(bytes[i - 1]);
        i = match byte {
            b'-' if bytes.get(i + 1) == Some(&b'-') => bytes[i..]
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
                .map_or(bytes.len(), |end| i + end + 1),
            b'/' if bytes.get(i + 1) == Some(&b'*') => sql_text::skip_block_comment(bytes, i),
            b'"' => sql_text::skip_quoted(bytes, i + 1, b'"', false),
            b'$' if !after_ident => sql_text::skip_dollar_quoted(bytes, i),
            b'\'' => {
                let escape_string = i > 0
                    && matches!(bytes[i - 1], b'e' | b'E')
                    && !(i > 1 && sql_text::is_ident_char(bytes[i - 2]));
                let end =
                    sql_text::skip_quoted(bytes, i + 1, b'\'', backslash_escapes || escape_string);
                kept.extend(std::iter::repeat_n(b' ', end - i));
                i = end;
                continue;
            }
            _ => i + 1,
        };
        kept.extend_from_slice(&bytes[start..i.min(bytes.len())]);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Leading keywords that change the database or other sessions although a `READ ONLY`
/// transaction lets them run (maintenance, locks, notifications).
const WRITES_DESPITE_READ_ONLY: &[&str] = &[
    "LOCK",
    "NOTIFY",
    "ANALYZE",
    "ANALYSE",
    "VACUUM",
    "REINDEX",
    "CLUSTER",
    "CHECKPOINT",
    "LOAD",
];

/// Functions that write, or affect other sessions, although a `READ ONLY` transaction lets them
/// run (large objects, notifications, WAL messages, signals, advisory locks), and built-ins that
/// run SQL text, which could call any of them out of sight.
const FUNCTIONS_DESPITE_READ_ONLY: &[&str] = &[
    "lo_creat",
    "lo_create",
    "lo_from_bytea",
    "lo_put",
    "lo_unlink",
    "lo_import",
    "lo_export",
    "lo_truncate",
    "lo_truncate64",
    "lo_open",
    "lowrite",
    "pg_notify",
    "pg_logical_emit_message",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared",
    "pg_advisory_xact_lock",
    "pg_advisory_xact_lock_shared",
    "pg_try_advisory_xact_lock",
    "pg_try_advisory_xact_lock_shared",
    "query_to_xml",
    "query_to_xmlschema",
    "query_to_xml_and_xmlschema",
    "cursor_to_xml",
    "cursor_to_xmlschema",
    "ts_stat",
    "ts_rewrite",
    "gin_clean_pending_list",
    "brin_summarize_new_values",
    "brin_summarize_range",
    "brin_desummarize_range",
];

/// Checks a statement run for a credential (or a batch) that may only read, on top of
/// [`check_text`]: PostgreSQL's `READ ONLY` transactions refuse writes to tables, but not
/// large objects, maintenance commands, locks or notifications, which a reader may not use
/// either (`403 READ_ONLY`). A name refused here is refused wherever it appears as a word.
pub(crate) fn check_read_only_text(sql: &str) -> Result<(), ApiError> {
    let refused = |what: &str| {
        Err(ApiError::new(
            crate::protocol::error::ErrorCode::ReadOnly,
            format!("{what} is not available to a request that may only read; nothing was written"),
        ))
    };
    if let Some(keyword) = leading(sql, WRITES_DESPITE_READ_ONLY) {
        return refused(keyword);
    }
    let lower = sql.to_ascii_lowercase();
    let words = lower.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'));
    for word in words {
        if FUNCTIONS_DESPITE_READ_ONLY.contains(&word) {
            return refused(word);
        }
        if let Some(prefix) = LINK_PREFIXES
            .iter()
            .find(|prefix| word == "dblink" || word.starts_with(*prefix))
        {
            return Err(ApiError::new(
                crate::protocol::error::ErrorCode::ReadOnly,
                format!(
                    "{word} is not available to a request that may only read: {} runs SQL on a \
                     connection of its own, outside this read's read-only transaction; nothing \
                     was written",
                    prefix.trim_end_matches('_')
                ),
            ));
        }
    }
    Ok(())
}

/// Name prefixes of the functions of `dblink` and `postgres_fdw`, refused in reads wherever a
/// word starts with one (`dblink_exec`, `postgres_fdw_disconnect_all`, ...), and `dblink` itself:
/// `dblink_exec('INSERT ...')` (and `dblink('...')`, which runs any statement) writes through
/// a connection of its own, which the read's `READ ONLY` transaction does not reach. What they
/// leave open is closed by the session reset (see `setup`, ADR 0043).
const LINK_PREFIXES: &[&str] = &["dblink_", "postgres_fdw_"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::ErrorCode;

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
            "/* /* */ x */ SET statement_timeout = 0",
            "/* /* */ x */ RESET ALL",
            "ALTER ROLE CURRENT_USER PASSWORD 'mine'",
            "alter user sqlhttp_client set search_path = evil",
            "SELECT U&\"set\\005fconfig\"('role', 'x', true)",
            "-- x\rSET search_path = evil",
            "DECLARE c CURSOR WITH HOLD FOR SELECT pg_sleep(8)",
            // Empty statements before the keyword: PostgreSQL drops them (ADR 0027).
            ";SET statement_timeout = 0",
            "; ;RESET ALL",
            ";DO $$ BEGIN END $$",
            ";LISTEN x",
            ";PREPARE p AS SELECT 1",
            ";DECLARE c CURSOR FOR SELECT 1",
            ";ALTER ROLE CURRENT_USER SET work_mem = '1GB'",
            "/* x */;-- y\r;COPY t TO STDOUT",
            "copy t from stdin",
        ] {
            let err = check_text(sql).unwrap_err();
            assert_eq!(err.code, ErrorCode::StatementNotAllowed, "{sql}");
        }
    }

    #[test]
    fn a_refused_function_named_in_data_is_data() {
        for sql in [
            "SELECT 'dataset_configuration'",
            "INSERT INTO t (k) VALUES ('set_config') RETURNING k",
            "SELECT 'it''s set_config'",
            "SELECT E'\\' set_config \\''",
            "SELECT x'00', 'set_config'",
        ] {
            assert_eq!(check_text(sql), Ok(()), "{sql}");
        }
        for sql in [
            // The backslash does not escape in a plain literal: the call is outside it.
            "SELECT 'a\\', set_config('role', 'x', false), '--'",
            "SELECT \"set_config\"('role', 'x', false)",
            "SELECT $$ ' $$, set_config('role', 'x', false)",
            "-- it's\nSELECT set_config('role', 'x', false)",
            "/* ' */ SELECT set_config('role', 'x', false)",
            "SELECT pg_catalog.set_config('role', 'x', false) AS \"'\"",
            // A function body runs later: a name in it is refused.
            "CREATE FUNCTION f() RETURNS text LANGUAGE sql AS $$ SELECT set_config('role', 'x', false) $$",
        ] {
            let err = check_text(sql).unwrap_err();
            assert_eq!(err.code, ErrorCode::StatementNotAllowed, "{sql}");
        }
    }

    #[test]
    fn readers_may_not_write_what_read_only_transactions_let_through() {
        for sql in [
            "SELECT lo_from_bytea(0, 'x')",
            "select LO_CREATE(0)",
            "SELECT lo_put(16978, 0, 'HACKED')",
            "LOCK TABLE t IN ACCESS EXCLUSIVE MODE",
            "/* /* */ x */ ANALYZE t",
            "CLUSTER t USING t_pkey",
            "NOTIFY c",
            "SELECT pg_notify('c', 'x')",
            "SELECT pg_terminate_backend(1)",
            "SELECT pg_advisory_lock(1), pg_sleep(1)",
            "SELECT query_to_xml('select 1', true, false, '')",
            ";LOCK TABLE t",
            ";NOTIFY c",
            ";;ANALYZE t",
            "SELECT dblink_exec('dbname=x', 'INSERT INTO t VALUES (1)')",
            "SELECT * FROM dblink('x', 'DELETE FROM t RETURNING 1') AS t(x int)",
            "SELECT public.DBLINK_CONNECT('x', 'dbname=y')",
            "SELECT dblink_connect_u('dbname=y')",
            "SELECT \"dblink_exec\"('INSERT INTO t VALUES (1)')",
            "SELECT postgres_fdw_disconnect_all()",
        ] {
            let err = check_read_only_text(sql).unwrap_err();
            assert_eq!(err.code, ErrorCode::ReadOnly, "{sql}");
        }
        for sql in [
            "SELECT hello_world, lo_ FROM t",
            "SELECT * FROM locks",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "SELECT 'analyze' AS word",
            "SELECT mydblink, dblinks, postgres_fdw FROM t",
        ] {
            check_read_only_text(sql).unwrap();
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
