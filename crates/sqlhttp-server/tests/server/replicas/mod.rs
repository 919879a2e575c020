//! PostgreSQL read replicas (hot standbys behind `--read-replica`) and bookmarks: reads served
//! by a replica that has caught up, bookmarks a server cannot satisfy, and replicas that stall or
//! stop. Each test needs PostgreSQL and starts a cluster with streaming standbys of its own.

mod bookmarks;
mod hardening;
pub(crate) mod reads;
