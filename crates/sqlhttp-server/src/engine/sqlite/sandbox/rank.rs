//! FTS5's `rank` found in a statement's compiled plan (ADR 0032): a query that constrains it
//! would make the table call a function of the client's choosing inside one step.
//!
//! Reads a plan with `EXPLAIN`; knows nothing of the authorizer's state or of requests.

use rusqlite::Connection;
use rusqlite::fallible_iterator::FallibleIterator as _;

/// Refuses `sql` (compiled once already, on `conn`, and found to read a column named `rank`)
/// if its plan hands a `rank` constraint to an FTS5 table: FTS5 marks that constraint `r` in
/// the plan string its `xBestIndex` returns, which SQLite shows as the `VFilter` opcode's P4
/// (`rM1` for `t MATCH ? AND rank MATCH ?`). This sees the constraint however the statement
/// spells it (`rank MATCH`, `rank = x`, `x = t.rank`, `match(x, rank)`, in a view or a
/// subquery). A statement SQLite compiled as an `EXPLAIN` (`is_explain`, from the compiled
/// statement, not from the text: the two engines' readings of a text may disagree on its first
/// word) runs nothing. Compile it sandboxed, as the statement was.
pub(crate) fn refuse_rank_constraint(
    conn: &Connection,
    sql: &str,
    is_explain: bool,
) -> Result<(), RankError> {
    if is_explain {
        return Ok(());
    }
    let explain = format!("EXPLAIN {sql}");
    let mut batch = rusqlite::Batch::new(conn, &explain);
    let Some(mut plan) = batch.next().map_err(RankError::Engine)? else {
        return Ok(());
    };
    let mut rows = plan.raw_query();
    while let Some(row) = rows.next().map_err(RankError::Engine)? {
        let opcode: String = row.get(1).map_err(RankError::Engine)?;
        if opcode != "VFilter" {
            continue;
        }
        let idx: Option<String> = row.get(5).map_err(RankError::Engine)?;
        if idx.as_deref().is_some_and(is_fts5_rank_plan) {
            return Err(RankError::Refused);
        }
    }
    Ok(())
}

/// Whether a virtual table's plan string is FTS5's and holds a `rank` constraint: FTS5's
/// strings are made of `r`, `M`/`L`/`G` and a column number, `=`, `<` and `>` only (R*Tree's
/// use other letters, and a plan string of any other module with an `r` has others too).
pub(super) fn is_fts5_rank_plan(idx: &str) -> bool {
    idx.contains('r')
        && idx.bytes().all(|b| {
            matches!(b, b'r' | b'M' | b'L' | b'G' | b'=' | b'<' | b'>') || b.is_ascii_digit()
        })
}

/// Why [`refuse_rank_constraint`] failed.
#[derive(Debug)]
pub(crate) enum RankError {
    /// The plan constrains FTS5's rank.
    Refused,
    /// The plan could not be read.
    Engine(rusqlite::Error),
}
