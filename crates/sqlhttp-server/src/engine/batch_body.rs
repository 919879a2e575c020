//! The body of a batch's answer, `{"results": [...]}`: each statement's result body appended in
//! order under `--max-result-bytes`, and the error for a read-only batch's statement that writes.
//! Shared by the SQLite and PostgreSQL engines; knows nothing about how statements run.

use crate::api_error::{ApiError, ErrorCode};

/// A batch's answer, built one statement result at a time.
pub(crate) struct BatchBody {
    out: Vec<u8>,
    limit: usize,
}

impl BatchBody {
    /// An empty answer for `statements` statements, at most `limit` bytes long.
    pub(crate) fn new(limit: usize, statements: usize) -> BatchBody {
        let mut out = Vec::with_capacity(64 * statements + 16);
        out.extend_from_slice(b"{\"results\":[");
        BatchBody { out, limit }
    }

    /// Appends statement `index`'s result body; refuses (`413 RESULT_TOO_LARGE`, naming the
    /// statement) when the answer would outgrow the limit.
    pub(crate) fn push(&mut self, index: usize, body: &[u8]) -> Result<(), ApiError> {
        let limit = self.limit;
        if index > 0 {
            self.out.push(b',');
        }
        // The body and the closing `]}`.
        if self.out.len() + body.len() + 2 > limit {
            return Err(ApiError::new(
                ErrorCode::ResultTooLarge,
                format!(
                    "the batch's results are larger than this server's limit of {limit} bytes \
                     (--max-result-bytes), reached at statement {index}; select fewer rows, or \
                     split the reads over several requests"
                ),
            )
            .at_statement(index));
        }
        self.out.extend_from_slice(body);
        Ok(())
    }

    /// The whole answer.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(b"]}");
        self.out
    }
}

/// The error for statement `index` of a read-only batch, which writes: nothing was written.
pub(crate) fn writes_in_read_only_batch(index: usize) -> ApiError {
    ApiError::new(
        ErrorCode::ReadOnly,
        format!("statement {index} writes, but the batch is read-only; nothing was written"),
    )
    .at_statement(index)
}
