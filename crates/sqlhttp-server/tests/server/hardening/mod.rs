//! The server under attack and under load through real sockets (`attacks`), and PostgreSQL
//! under a hostile client (`pg_hostile_client`: `dblink`, a foreign standby, shutdown during a
//! transaction).

mod attacks;
mod pg_hostile_client;
