//! What a statement answers on `/api/v1/sql`, `/api/v1/batch` and `/api/v1/describe/statement`:
//! the body and its values, errors, verified reads, schema changes, streaming and abandoned
//! streams, and what a success cost (`stats`). Files named `pg_*` hold what only PostgreSQL has
//! (its types, SQLSTATEs, the way it reads statement text); the rest run on both engines or on
//! SQLite as their module docs say.

mod abandoned;
mod answers;
mod batch;
mod describe_statement;
mod kept_statements;
mod pg_answers;
mod pg_errors;
mod pg_text;
mod pg_types;
mod reads;
mod schema;
mod stats;
mod streaming;
