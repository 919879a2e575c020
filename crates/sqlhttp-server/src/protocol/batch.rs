//! Decoding a `POST /api/v1/batch` body into a [`BatchRequest`]: its statements, each exactly a
//! `POST /api/v1/sql` body decoded by [`SqlRequest::parse`], whether it may only read, and how
//! its foreign keys are checked.
//!
//! Pure functions over bytes: no HTTP types, no engine. A failure that belongs to one statement
//! names it (zero-based) in the error's `statement` member.

use serde_json::value::RawValue;

use crate::engine::interactive::Isolation;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;

/// A decoded batch: statements to run in order in one transaction.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchRequest {
    pub(crate) statements: Vec<SqlRequest>,
    /// Runs on a reader, in a read-only transaction; a statement that writes is refused.
    pub(crate) read_only: bool,
    /// How foreign keys are enforced while it runs.
    pub(crate) foreign_keys: ForeignKeys,
    /// The isolation it asked for (`"isolation"`); `None` is the engine's default for a batch.
    pub(crate) isolation: Option<Isolation>,
}

/// How a write batch's foreign keys are enforced (`"foreign_keys"` in the body): the
/// protocol's. `CheckedAtCommit` is SQLite's: off while the statements run (no `ON DELETE`/`ON
/// UPDATE` actions, no checks) and every key checked once before the batch commits, what
/// SQLite's table rebuild needs; refused on PostgreSQL, which alters tables in place.
pub(crate) use sqlhttp_protocol::body::ForeignKeys;

/// The body as the protocol crate types it, each statement kept raw until it is decoded as a
/// `POST /api/v1/sql` body.
type Wire<'a> = sqlhttp_protocol::body::BatchRequest<&'a RawValue>;

const SHAPE: &str = "the body must be a JSON object {\"statements\": [{\"sql\": string, \"params\": array}, ...], \"read_only\": bool, \"foreign_keys\": \"enforced\" | \"checked_at_commit\", \"isolation\": \"serializable\" | \"repeatable_read\" | \"read_committed\"}";

impl BatchRequest {
    /// Decodes and validates a batch body of at most `max_statements` statements. A malformed
    /// body is `400 BAD_REQUEST` (naming the statement at fault); too many statements is
    /// `413 PAYLOAD_TOO_LARGE`.
    pub(crate) fn parse(body: &[u8], max_statements: usize) -> Result<BatchRequest, ApiError> {
        let wire: Wire<'_> = serde_json::from_slice(body).map_err(|e| {
            if e.to_string().starts_with("missing field `statements`") {
                return ApiError::bad_request("`statements` is missing");
            }
            ApiError::bad_request(format!("{SHAPE}: {e}"))
        })?;
        crate::protocol::request::object(body, SHAPE)?;
        let raw = wire.statements;
        if raw.is_empty() {
            return Err(ApiError::bad_request(
                "`statements` is empty: a batch has at least one statement",
            ));
        }
        if raw.len() > max_statements {
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the batch has {} statements; this server accepts at most {max_statements} \
                     in one batch (--max-batch-statements)",
                    raw.len()
                ),
            ));
        }
        let statements = raw
            .iter()
            .enumerate()
            .map(|(index, raw)| {
                let at = |e: ApiError| {
                    ApiError::new(e.code, format!("statement {index}: {}", e.message))
                        .at_statement(index)
                };
                let statement = SqlRequest::parse(raw.get().as_bytes()).map_err(at)?;
                if statement.read_only {
                    // Honoured for one statement and not the others would be a false promise.
                    return Err(at(ApiError::bad_request(
                        "`read_only` belongs to the batch, not to its statements",
                    )));
                }
                Ok(statement)
            })
            .collect::<Result<_, _>>()?;
        let read_only = wire.read_only;
        let foreign_keys = wire.foreign_keys.unwrap_or_default();
        if read_only && foreign_keys == ForeignKeys::CheckedAtCommit {
            return Err(ApiError::bad_request(
                "`foreign_keys: checked_at_commit` is for a write batch: a read-only batch \
                 changes nothing to check",
            ));
        }
        let isolation = wire.isolation;
        Ok(BatchRequest {
            statements,
            read_only,
            foreign_keys,
            isolation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::request::Param;

    fn bad(body: &str) -> ApiError {
        BatchRequest::parse(body.as_bytes(), 3).unwrap_err()
    }

    #[test]
    fn decodes_the_isolation_asked_for() {
        let parse = |isolation: &str| {
            BatchRequest::parse(
                format!(r#"{{"statements":[{{"sql":"SELECT 1"}}],"isolation":{isolation}}}"#)
                    .as_bytes(),
                3,
            )
        };
        assert_eq!(parse("null").unwrap().isolation, None);
        assert_eq!(
            parse(r#""serializable""#).unwrap().isolation,
            Some(Isolation::Serializable)
        );
        assert_eq!(
            parse(r#""repeatable_read""#).unwrap().isolation,
            Some(Isolation::RepeatableRead)
        );
        assert_eq!(
            parse(r#""read_committed""#).unwrap().isolation,
            Some(Isolation::ReadCommitted)
        );
        for bad in [r#""snapshot""#, "1", r#""""#] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn decodes_statements_and_the_read_only_flag() {
        let batch = BatchRequest::parse(
            br#"{"statements":[{"sql":"SELECT ?","params":[1]},{"sql":"SELECT 2"}],"read_only":true}"#,
            3,
        )
        .unwrap();
        assert!(batch.read_only);
        assert_eq!(batch.statements.len(), 2);
        assert_eq!(batch.statements[0].params, vec![Param::Integer(1)]);
        let batch = BatchRequest::parse(
            br#"{"statements":[{"sql":"SELECT 1"}],"read_only":null}"#,
            3,
        )
        .unwrap();
        assert!(!batch.read_only);
    }

    #[test]
    fn refuses_malformed_batches_naming_the_statement() {
        for body in [
            "[]",
            "{}",
            r#"{"statements":{}}"#,
            r#"{"statements":[]}"#,
            "x",
        ] {
            let err = bad(body);
            assert_eq!(err.code, ErrorCode::BadRequest, "{body}");
            assert_eq!(err.statement, None, "{body}");
        }
        let err = bad(r#"{"statements":[{"sql":"SELECT 1"},{"params":[]}]}"#);
        assert_eq!(err.code, ErrorCode::BadRequest);
        assert_eq!(err.statement, Some(1));
        assert!(err.message.starts_with("statement 1:"), "{}", err.message);
        let err = bad(r#"{"statements":[{"sql":"SELECT ?","params":[[1]]}]}"#);
        assert_eq!(err.statement, Some(0));
        let err = bad(r#"{"statements":[{"sql":"SELECT 1"}],"read_only":"yes"}"#);
        assert_eq!(err.code, ErrorCode::BadRequest);
    }

    #[test]
    fn foreign_keys_are_enforced_or_checked_at_commit() {
        let parse = |body: &str| BatchRequest::parse(body.as_bytes(), 3);
        let one = r#"{"statements":[{"sql":"SELECT 1"}]"#;
        assert_eq!(
            parse(&format!("{one}}}")).unwrap().foreign_keys,
            ForeignKeys::Enforced
        );
        assert_eq!(
            parse(&format!(r#"{one},"foreign_keys":"checked_at_commit"}}"#))
                .unwrap()
                .foreign_keys,
            ForeignKeys::CheckedAtCommit
        );
        for bad in [
            r#","foreign_keys":"off""#,
            r#","foreign_keys":false"#,
            r#","foreign_keys":"checked_at_commit","read_only":true"#,
        ] {
            let err = parse(&format!("{one}{bad}}}")).unwrap_err();
            assert_eq!(err.code, ErrorCode::BadRequest, "{bad}");
        }
    }

    #[test]
    fn too_many_statements_is_413() {
        let err = bad(
            r#"{"statements":[{"sql":"SELECT 1"},{"sql":"SELECT 1"},{"sql":"SELECT 1"},{"sql":"SELECT 1"}]}"#,
        );
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
        assert!(
            err.message.contains("--max-batch-statements"),
            "{}",
            err.message
        );
    }

    proptest::proptest! {
        /// The decoder answers every body without panicking.
        #[test]
        fn any_body_decodes_or_is_refused(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = BatchRequest::parse(&body, 100);
        }
    }
}
