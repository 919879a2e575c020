//! The HTTP surface around the statements: routing, methods and bodies (`api`), conformance to
//! docs/protocol.md, the OpenAPI document and its validator, real TCP servers, misbehaving
//! connections, and TLS to clients with HTTP/2's bounds (`tls`, whose helpers `https_h2`,
//! `h2_permits` and `postgres::tls` use), and a read credential refused the same way on every
//! route (`read_credential`), and an `Accept-Encoding` that admits nothing refused before it
//! runs (`accept_encoding`).

mod accept_encoding;
mod api;
mod conformance;
mod connections;
mod h2_permits;
pub(crate) mod https_h2;
mod openapi;
pub(crate) mod openapi_schema;
mod read_credential;
mod tcp;
pub(crate) mod tls;
