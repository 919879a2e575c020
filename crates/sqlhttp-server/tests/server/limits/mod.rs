//! Every bound a request is held to: the statement timeout (both engines, and PostgreSQL's own
//! guard), memory and disk bounds, shares of the buffer budget, SQLite's built-in functions that
//! outlast a bound, what a connection's statement cache keeps, statements SQLite gives up, and
//! the write-ahead log's hard bound.

mod bounds;
mod budget_shares;
mod builtins;
mod give_up;
mod pg_timeouts;
mod sqlite_wal_bound;
mod statement_cache;
mod timeouts;
