//! What a statement that changes a schema is checked against before its effects are kept:
//! [`SchemaRows`], the schema rows no client may create or change, read before and after.
//!
//! Reads the schema tables outside the sandbox; knows nothing of the authorizer or of requests.

use rusqlite::Connection;

use super::rules::{RANK_REFUSED, SERVER_PREFIX, TEMP_REFUSED, reserved};

/// The schema rows a client statement may not create or change, read before and after a
/// statement that changes a schema: every object of the `temp` database but the server's
/// `_sqlhttp_rowid_probe` (see `exec`), and every object of `main` whose name, or whose table's
/// name, is in the server's namespace. Read outside the sandbox.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SchemaRows {
    temp: Vec<(String, String)>,
    reserved: Vec<(String, String, String)>,
    /// The stored `rank` settings of the FTS5 tables the statement inserts into: table, key as
    /// stored (FTS5 takes it in any case), value as `quote()` writes it.
    rank: Vec<(String, String, String)>,
}

/// Objects of `temp` other than the server's probe table.
pub(super) const TEMP_ROWS: &str = "SELECT type, name FROM temp.sqlite_schema \
WHERE NOT (type = 'table' AND name = '_sqlhttp_rowid_probe') ORDER BY type, name";

/// Objects of `main` in the server's namespace, or on a table in it.
pub(super) const RESERVED_ROWS: &str = "SELECT type, name, tbl_name FROM main.sqlite_schema \
WHERE substr(name, 1, 8) = '_sqlhttp' COLLATE NOCASE \
OR substr(tbl_name, 1, 8) = '_sqlhttp' COLLATE NOCASE ORDER BY type, name, tbl_name";

impl SchemaRows {
    /// Reads the rows from the schema tables, and the `rank` settings of the FTS5 tables `fts5`.
    pub(crate) fn read(conn: &Connection, fts5: &[String]) -> rusqlite::Result<SchemaRows> {
        let mut rank = Vec::new();
        for table in fts5 {
            let config = format!("{table}_config").replace('"', "\"\"");
            let mut query = conn.prepare(&format!(
                "SELECT k, quote(v) FROM main.\"{config}\" WHERE k = 'rank' COLLATE NOCASE \
                 ORDER BY k"
            ))?;
            let rows = query.query_map([], |row| Ok((table.clone(), row.get(0)?, row.get(1)?)))?;
            for row in rows {
                rank.push(row?);
            }
        }
        let temp = conn
            .prepare_cached(TEMP_ROWS)?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let reserved = conn
            .prepare_cached(RESERVED_ROWS)?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(SchemaRows {
            temp,
            reserved,
            rank,
        })
    }

    /// Why a statement that took the schema from `self` to `after` must not be kept: it left a
    /// temporary object, or it created, renamed or changed an object in the server's namespace.
    /// Whether a full-text table's stored `rank` setting differs in `after`.
    pub(crate) fn rank_changed(&self, after: &SchemaRows) -> bool {
        after.rank != self.rank
    }

    pub(crate) fn refusal(&self, after: &SchemaRows) -> Option<String> {
        if self.rank_changed(after) {
            return Some(RANK_REFUSED.to_owned());
        }
        if let Some((kind, name)) = after.temp.first() {
            return Some(format!(
                "the statement would create the temporary {kind} `{name}`: {TEMP_REFUSED}"
            ));
        }
        if after.reserved != self.reserved {
            let name = after
                .reserved
                .iter()
                .find(|row| !self.reserved.contains(row))
                .or_else(|| {
                    self.reserved
                        .iter()
                        .find(|row| !after.reserved.contains(row))
                })
                .map_or(SERVER_PREFIX, |(_, name, _)| name.as_str());
            return Some(format!(
                "the statement would change the server's namespace: {}",
                reserved(name)
            ));
        }
        None
    }
}
