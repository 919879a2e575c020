//! The PostgreSQL engine's catalog queries behind `POST /api/v1/describe`, in the same shape
//! as the SQLite engine's (`engine::sqlite::catalog`): the tables and views of the schemas on the client
//! role's search path, and one table's columns.
//!
//! Plain SQL text, run as a verified read by the client role, so it lists what that role can
//! see. Knows PostgreSQL's catalog (`pg_class`, `pg_attribute`, `pg_index`); nothing about HTTP
//! or connections.

use crate::engine::Catalog;

/// The two queries, as the engine contract hands them to `describe`.
pub(crate) const CATALOG: Catalog = Catalog {
    tables: TABLES,
    columns: COLUMNS,
};

/// Tables (plain, partitioned, foreign) and views (plain, materialized) of the schemas on the
/// search path, by name: columns `name`, `type` (`table` or `view`). The server's schema is
/// left out.
pub(crate) const TABLES: &str = "SELECT c.relname::text AS name, \
     CASE WHEN c.relkind IN ('v', 'm') THEN 'view' ELSE 'table' END AS type \
     FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
     WHERE c.relkind IN ('r', 'p', 'f', 'v', 'm') \
     AND n.nspname = ANY (pg_catalog.current_schemas(false)) AND n.nspname <> '_sqlhttp' \
     ORDER BY 1";

/// One table's columns in order, for the name bound as the one parameter: looked up among the
/// tables `TABLES` lists (the schemas on the search path, in its order; never `pg_catalog`'s,
/// which a `to_regclass` would find), the exact name first, then as PostgreSQL folds an
/// unquoted one. Columns `name`, `type` (`format_type`'s), `nullable` and `primary_key` (1 or
/// 0), `default` (its SQL text, or NULL). No row when there is no such table.
pub(crate) const COLUMNS: &str = "WITH t AS (SELECT c.oid \
     FROM pg_catalog.pg_class AS c \
     JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
     JOIN pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY \
     AS s(name, position) ON s.name = n.nspname \
     WHERE c.relkind IN ('r', 'p', 'f', 'v', 'm') AND n.nspname <> '_sqlhttp' \
     AND c.relname IN (?1::text, pg_catalog.lower(?1::text)) \
     ORDER BY c.relname = ?1::text DESC, s.position LIMIT 1) \
     SELECT a.attname::text AS name, \
     pg_catalog.format_type(a.atttypid, a.atttypmod) AS type, \
     CASE WHEN a.attnotnull OR coalesce(a.attnum = ANY (i.indkey), false) THEN 0 ELSE 1 END \
     AS nullable, \
     pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS \"default\", \
     CASE WHEN coalesce(a.attnum = ANY (i.indkey), false) THEN 1 ELSE 0 END AS primary_key \
     FROM t JOIN pg_catalog.pg_attribute AS a ON a.attrelid = t.oid \
     LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = t.oid AND d.adnum = a.attnum \
     LEFT JOIN pg_catalog.pg_index AS i ON i.indrelid = t.oid AND i.indisprimary \
     WHERE a.attnum > 0 AND NOT a.attisdropped \
     ORDER BY a.attnum";
