//! Several `sqlhttpd` processes on one database (peers, each with its `--advertise-url`): a
//! transaction's steps forwarded to the peer that holds it and signed with the peer secret, and
//! keyed writes replayed by another peer behind a load balancer, and verified reads whose
//! answers were lost asked again of the same peer, another, or one started after a kill. PostgreSQL's own standbys are
//! `replicas`.

mod load_balanced;
mod signed_forwarding;
mod transactions;
mod verified_reads;
