//! The `sqlhttpd` binary's parts besides its serve path (which `main.rs` keeps): the flags and
//! how they become a [`Config`](sqlhttp_server::Config) ([`flags`], their values' parsers in
//! [`values`]), logging and span export ([`logging`]), and the process signals the binary
//! answers ([`signals`]).
//!
//! Binary only: nothing here is part of the `sqlhttp_server` library, and nothing here knows
//! more of the server than the library's public API.

pub(crate) mod flags;
pub(crate) mod logging;
pub(crate) mod signals;
pub(crate) mod values;
