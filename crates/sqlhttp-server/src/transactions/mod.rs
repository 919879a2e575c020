//! Interactive transactions, a layer of their own beside `engine/` (ADR 0058, amending ADR
//! 0036): the HTTP handlers (`http::transaction`) hand it admitted requests, and it holds the
//! engine ([`Backend`](crate::engine::Backend)) and asks it for sessions and commit records
//! through the [`Engine`](crate::engine::Engine) trait. No engine imports it.
//!
//! - **Tokens** are `<instance>.<128 random bits>` in hex: `instance` names the process that
//!   holds the transaction (drawn at start), so a server that does not know a token can tell
//!   one of its own that never existed (`404`) from a peer's (another sqlhttpd process on the
//!   same database) or an earlier run's (whose commit record it reads; nothing recorded means
//!   nothing committed: `TRANSACTION_EXPIRED`). A token is bound to the credential that opened
//!   it: any other one gets `404`.
//! - **Statements** carry their sequence number: the next one runs, the last one is answered
//!   from its stored result (a re-send after a lost answer), any other is
//!   `TRANSACTION_STEP_OUT_OF_ORDER`. Only the last statement's result is kept (within
//!   `--max-result-bytes`, held against the server's budget). A failure that depends on load
//!   (a timeout, `503`) is not stored and does not advance the sequence: the statement was
//!   undone, and its re-send runs it again.
//! - **Commit** stores the transaction's outcome with its effects through the engine (see
//!   `engine::interactive::Record`); a re-sent COMMIT, and the outcome endpoint, answer from the
//!   finished outcomes (kept for the idempotency TTL in memory, and the commit record in the
//!   database).
//! - **Bounds**: `--max-transactions` open at once (`503` past it), an idle timeout and a
//!   lifetime cap (then rolled back: `TRANSACTION_EXPIRED`), checked when a transaction is
//!   used and by a reaper task.
//! - **A share per credential** (`owners`): one owner may hold at most half of the open
//!   transactions and half of the part of the budget stored results may take, so one
//!   credential can never take them all from the others. Finished outcomes are a fair share
//!   per owner too (`transactions::finished`).
//! - **Answers are shared, not copied**: the stored result is one buffer holding its shares of
//!   the budget; its answer and every replay of it send that buffer and hold those shares
//!   until they are sent ([`Answer`]), so unread replays cost nothing more and what they keep
//!   alive stays counted.
//!
//! The files: `registry` (the registry, its bounds, its reaper), `entry` (what it keeps of
//! one open transaction), `open` (opening),
//! `running` (statements, commit, rollback, outcome), `ending` (how a transaction ended and how
//! a later request for it is answered, commit records included), `owners` (the per-credential
//! shares), `finished` (finished outcomes kept, a fair share per owner), `peers` (the other sqlhttpd
//! processes on the same database: where each is reached, whether it lives, the secret they
//! share). Response bodies are `protocol::transaction`'s. Knows the engine contract and the
//! protocol; nothing about HTTP or either engine's SQL.

mod ending;
mod entry;
mod finished;
mod open;
mod owners;
pub(crate) mod peers;
mod registry;
mod running;

pub(crate) use entry::Answer;
pub(crate) use registry::{TransactionCounts, Transactions};
