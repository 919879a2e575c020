//! Behavioural tests of `sqlhttpd` through its public API: the in-process app
//! (`app(state)` driven with `oneshot`), real TCP servers, and the built binary.

mod abandoned;
mod answers;
mod api;
mod batch;
mod binary;
mod bounds;
mod builtins;
mod common;
mod conformance;
mod connections;
mod engines;
mod give_up;
mod hardening;
mod idempotency;
mod migrations;
mod openapi;
mod operations;
mod pg_answers;
mod pg_idempotency;
mod pg_pipeline;
mod pg_session;
mod pg_text;
mod postgres;
mod reads;
mod replicas;
mod sandbox_effects;
mod schema;
mod streaming;
mod tcp;
mod timeouts;
mod tls;
