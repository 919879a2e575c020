//! The body of a batch's answer, `{"results": [...], "stats": {...}}`: each statement's result
//! body appended in order under `--max-result-bytes`, the whole batch's stats (its statements'
//! time since the body began, their rows read and written, summed from their own `stats`), and
//! how a statement's failure answers for the batch (named by its index; a read-only batch's
//! statement that writes said so). Shared by the SQLite and PostgreSQL engines' batch loops;
//! knows nothing about how statements run.

use std::time::Instant;

use sqlhttp_protocol::body::{self, Stats};

use crate::protocol::bookmark::ServedBy;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::result;

/// A batch's answer, built one statement result at a time.
pub(crate) struct BatchBody {
    out: Vec<u8>,
    limit: usize,
    began: Instant,
    /// The statements' rows read, while each said.
    rows_read: Option<u64>,
    rows_written: u64,
    served_by: ServedBy,
}

/// The `stats` a statement's result body ends with, as written by `protocol::result`.
fn stats_of(body: &[u8]) -> Option<Stats> {
    const MEMBER: &[u8] = b"\"stats\":";
    let at = memchr::memmem::rfind(body, MEMBER)? + MEMBER.len();
    // The result's closing brace follows the stats object.
    serde_json::from_slice(body.get(at..body.len().checked_sub(1)?)?).ok()
}

impl BatchBody {
    /// An empty answer for `statements` statements, at most `limit` bytes long.
    pub(crate) fn new(limit: usize, statements: usize) -> BatchBody {
        let mut out = Vec::with_capacity(64 * statements + 16);
        out.extend_from_slice(b"{\"results\":[");
        // A batch run again (a stale statement re-prepared) starts its answer afresh.
        let _ = crate::engine::grow_to(out.len(), true);
        BatchBody {
            out,
            limit,
            began: Instant::now(),
            rows_read: Some(0),
            rows_written: 0,
            served_by: ServedBy::Primary,
        }
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
        let stats = stats_of(body).unwrap_or_default();
        self.rows_read = self.rows_read.zip(stats.rows_read).map(|(a, b)| a + b);
        self.rows_written += stats.rows_written.unwrap_or(0);
        if stats.served_by == Some(body::ServedBy::Replica) {
            self.served_by = ServedBy::Replica;
        }
        // The buffered job's share covers the answer so far; the next statement's rows count
        // after it.
        crate::engine::grow_to(self.out.len(), true).map_err(|err| err.at_statement(index))
    }

    /// The whole answer, its `stats` last.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.push(b']');
        result::stats(
            &mut self.out,
            self.began.elapsed(),
            self.rows_read,
            Some(self.rows_written),
            self.served_by,
        );
        self.out.push(b'}');
        self.out
    }
}

impl BatchBody {
    /// Appends statement `index`'s result, or answers its failure for the whole batch: named by
    /// its index, and a write in a read-only batch (`403 READ_ONLY` from the engine) said so.
    pub(crate) fn push_result(
        &mut self,
        index: usize,
        result: Result<Vec<u8>, ApiError>,
    ) -> Result<(), ApiError> {
        match result {
            Ok(body) => self.push(index, &body),
            Err(err) if err.code == ErrorCode::ReadOnly => Err(writes_in_read_only_batch(index)),
            Err(err) => Err(err.at_statement(index)),
        }
    }
}

/// The error for statement `index` of a read-only batch, which writes: nothing was written.
fn writes_in_read_only_batch(index: usize) -> ApiError {
    ApiError::new(
        ErrorCode::ReadOnly,
        format!("statement {index} writes, but the batch is read-only; nothing was written"),
    )
    .at_statement(index)
}
