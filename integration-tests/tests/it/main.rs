//! End-to-end tests of the `sqlhttp` SDK against a live `sqlhttpd`, through real TCP, with faults
//! injected by `sqlhttp-testkit` (a failing connector and a chaos proxy).
//!
//! Environment:
//! * `SQLHTTP_TEST_URL` — run against this server instead of starting `sqlhttpd` in-process
//!   (users' CI runs the server as a container). Tests that need a server configured a particular
//!   way (tokens, `--no-idempotency`, a restart, a file database) start their own in-process server
//!   and say so when skipped.
//! * `SQLHTTP_TEST_TOKEN` — the bearer token for the server at `SQLHTTP_TEST_URL`, if it needs one.
//!
//! Every test uses tables of its own, so the suite can share one external server. The rate-limit
//! tests (`operations`) start servers of their own with a limit, and take a few seconds each: the
//! waits are the server's `Retry-After`. Retry backoff is
//! shortened to milliseconds; the only real waits are the ones a test is about (a one-second
//! `Retry-After`, a few hundred milliseconds of timeout).

mod batches;
mod blobs;
mod connector;
mod describe_statement;
mod errors;
mod faults;
mod harness;
mod hedging;
mod methods;
mod operations;
mod restart;
mod scalars;
mod stats;
mod streams;
mod timing;
mod transactions;
mod tx_surface;
mod writes;
