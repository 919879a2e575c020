//! The sandbox: what a client's statements may not reach, decided by what a statement does
//! (`effects`, on SQLite, whose helpers `pg_sandbox` uses) and on PostgreSQL (`pg_sandbox`).

pub(crate) mod effects;
mod pg_sandbox;
