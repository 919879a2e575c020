//! The PostgreSQL engine's own concerns, each test on a cluster or database of its own: how the
//! server logs in and owns the client role, the clean session each request starts from, the
//! request pipeline's prepared-statement cache, verified reads in one flight, and TLS to
//! PostgreSQL.

mod flights;
mod login;
mod pipeline;
mod requester_left;
mod reset;
mod session;
mod tls;
mod write_flights;
