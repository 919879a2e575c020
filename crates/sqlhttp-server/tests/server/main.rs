//! Behavioural tests of `sqlhttpd` through its public API: the in-process app
//! (`app(state)` driven with `oneshot`), real TCP servers, and the built binary.
//!
//! One module per area. A case that holds for both engines is written once and run on both by
//! [`engines::on_both_engines!`] (tests `area::case::sqlite` and `area::case::postgres`); what
//! only PostgreSQL has (its types, SQLSTATEs, sessions, roles, sandbox) is in the `pg_*` modules,
//! what only SQLite has stays in its area's module. `engines` also says how PostgreSQL tests find
//! a cluster (`SQLHTTPD_TEST_POSTGRES_URL`, or `scripts/start-postgres`) and are reported as
//! ignored on a machine without one.

mod abandoned;
mod answers;
mod api;
mod batch;
mod binary;
mod bounds;
mod budget_shares;
mod builtins;
mod common;
mod conformance;
mod connections;
mod describe_statement;
mod engines;
mod give_up;
mod h2_permits;
mod hardening;
mod https_h2;
mod idempotency;
mod migrations;
mod observability;
mod openapi;
mod openapi_schema;
mod operations;
mod otlp;
mod peers;
mod pg_answers;
mod pg_bookmarks;
mod pg_errors;
mod pg_hardening_round3;
mod pg_idempotency;
mod pg_login;
mod pg_outcome_unknown;
mod pg_pipeline;
mod pg_replica_hardening;
mod pg_replicas;
mod pg_reset;
mod pg_sandbox;
mod pg_session;
mod pg_text;
mod pg_timeouts;
mod pg_tls;
mod pg_types;
mod reads;
mod replicas;
mod sandbox_effects;
mod schema;
mod sqlite_tx_bounds;
mod sqlite_wal_bound;
mod stats;
mod streaming;
mod tcp;
mod timeouts;
mod tls;
mod transactions;
mod tx_hardening;
mod tx_history;
mod tx_replicas;
mod tx_retry_path;
