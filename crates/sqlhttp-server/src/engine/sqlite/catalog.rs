//! The SQLite engine's catalog queries behind `POST /api/v1/describe`: the client's tables and
//! views, and one table's columns, in the protocol's engine-neutral shape (see
//! `docs/protocol.md`, "Describing tables").
//!
//! Plain SQL text, run as a verified read like any client's query, so the sandbox sees it as
//! it sees theirs. Knows SQLite's catalog (`sqlite_schema`, `pragma_table_info`); nothing about
//! HTTP or connections.

use crate::engine::Catalog;

/// The two queries, as the engine contract hands them to `describe`.
pub(crate) const CATALOG: Catalog = Catalog {
    tables: TABLES,
    columns: COLUMNS,
};

/// Tables and views, by name: columns `name`, `type` (`table` or `view`). SQLite's own tables
/// and the server's (`_sqlhttp...`) are left out.
pub(crate) const TABLES: &str = "SELECT name, type FROM sqlite_schema \
     WHERE type IN ('table', 'view') \
     AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_sqlhttp%' ESCAPE '\\' \
     ORDER BY name";

/// One table's (or view's) columns in order, for the name bound as the one parameter (matched
/// as SQLite matches names, ignoring ASCII case): `name`, `type` (as declared), `nullable` and
/// `primary_key` (1 or 0; a primary-key column is not nullable), `default` (its SQL text, or
/// NULL). No row when there is no such table.
pub(crate) const COLUMNS: &str = "SELECT c.name, c.type, \
     CASE WHEN c.\"notnull\" OR c.pk > 0 THEN 0 ELSE 1 END AS nullable, \
     c.dflt_value AS \"default\", CASE WHEN c.pk > 0 THEN 1 ELSE 0 END AS primary_key \
     FROM sqlite_schema AS s, pragma_table_info(s.name) AS c \
     WHERE s.type IN ('table', 'view') AND s.name = ?1 COLLATE NOCASE \
     AND s.name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND s.name NOT LIKE '\\_sqlhttp%' ESCAPE '\\' \
     ORDER BY c.cid";
