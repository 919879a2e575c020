//! Exactly once: `Idempotency-Key` replay and its refusals on both engines (`keys`), the store on
//! PostgreSQL (`pg_store`), and writes whose COMMIT does not answer in time, answered
//! `OUTCOME_UNKNOWN` (`pg_outcome_unknown`).

mod keys;
mod pg_outcome_unknown;
mod pg_store;
