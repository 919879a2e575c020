//! The PostgreSQL engine: client statements on a pool of tokio-postgres connections, each
//! request in a transaction of the server's own, as the role `sqlhttp_client`.
//!
//! `placeholders` rewrites `?` into `$n`, `sqlstate` maps PostgreSQL's errors onto the
//! protocol's table, `types` maps values both ways. Knows nothing about HTTP.

mod placeholders;
mod sqlstate;
