//! Behavioural tests of `sqlhttpd` through its public API: the in-process app
//! (`app(state)` driven with `oneshot`), real TCP servers, and the built binary.
//!
//! One folder per area, named for what a reader looks for (`sql`, `transactions`, `peers`,
//! `replicas`, `idempotency`, `limits`, `sandbox`, `hardening`, `http`, `postgres`,
//! `operations`), each with a `mod.rs` that says what is in it. A case that holds for both
//! engines is written once and run on both by [`engines::on_both_engines!`] (tests
//! `area::file::case::sqlite` and `area::file::case::postgres`); what only PostgreSQL has is in
//! its subject's folder in a file named `pg_*` (or in `postgres/` and `replicas/`, which are
//! PostgreSQL's alone), what only SQLite has stays in its subject's file. `engines` also says how
//! PostgreSQL tests find a cluster (`SQLHTTPD_TEST_POSTGRES_URL`, or `scripts/start-postgres`)
//! and are reported as ignored on a machine without one. `common` holds the helpers every area
//! shares; neither holds assertions about the server.

mod common;
mod engines;

mod hardening;
mod http;
mod idempotency;
mod limits;
mod operations;
mod peers;
mod postgres;
mod replicas;
mod sandbox;
mod sql;
mod transactions;
