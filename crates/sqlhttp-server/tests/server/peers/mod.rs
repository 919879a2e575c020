//! Several `sqlhttpd` processes on one database (peers, each with its `--advertise-url`): a
//! transaction's steps forwarded to the peer that holds it and signed with the peer secret, and
//! keyed writes replayed by another peer behind a load balancer. PostgreSQL's own standbys are
//! `replicas`.

mod load_balanced;
mod signed_forwarding;
mod transactions;
