//! Interactive transactions (`/api/v1/transaction/...`) on one server: the basics (`basics`,
//! whose `open`/`step`/`post` helpers the other areas use), a hostile client, the second attempt
//! of each request, SQLite's bounds inside a transaction, and a history checker on PostgreSQL with
//! lagging standbys. Transactions forwarded between servers are `peers`.

pub(crate) mod basics;
mod hardening;
mod history;
mod retry_path;
mod sqlite_bounds;
