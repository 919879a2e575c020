//! `sqlhttpd` in operation, mostly against the built binary: the binary's start, flags and
//! SIGTERM, tokens and rate limits, request ids and `/metrics`, OTLP traces, and migrations
//! killed half-way.

mod binary;
mod migrations;
pub(crate) mod observability;
mod otlp;
pub(crate) mod tokens_and_rate_limits;
