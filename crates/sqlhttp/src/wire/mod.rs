//! The protocol v1 wire format as the SDK reads and writes its JSON: the success envelope read as it
//! arrives ([`envelope`]), the rows decoded from it straight into the caller's types ([`decode`],
//! public as `sqlhttp::decode`), and the typed blob value `{"base64": "..."}` both ways ([`blob`]).
//!
//! It knows JSON, serde and the shape of the protocol's bodies; nothing of HTTP, the transport,
//! retries or the builders that send requests. What an `error` member *means* is `response`'s.

pub(crate) mod blob;
pub mod decode;
pub(crate) mod envelope;
