//! The protocol's endpoint paths (all `POST` but the document and the probes).

/// One statement.
pub const SQL: &str = "/api/v1/sql";
/// Several statements in one transaction.
pub const BATCH: &str = "/api/v1/batch";
/// The tables, or one table's columns.
pub const DESCRIBE: &str = "/api/v1/describe";
/// One statement's parameters, result columns and whether it may write, nothing run.
pub const DESCRIBE_STATEMENT: &str = "/api/v1/describe/statement";
/// Opens an interactive transaction.
pub const TRANSACTION_OPEN: &str = "/api/v1/transaction/open";
/// One statement of an interactive transaction.
pub const TRANSACTION_STATEMENT: &str = "/api/v1/transaction/statement";
/// Commits an interactive transaction.
pub const TRANSACTION_COMMIT: &str = "/api/v1/transaction/commit";
/// Rolls an interactive transaction back.
pub const TRANSACTION_ROLLBACK: &str = "/api/v1/transaction/rollback";
/// How an interactive transaction ended.
pub const TRANSACTION_OUTCOME: &str = "/api/v1/transaction/outcome";
/// The OpenAPI document (`GET`).
pub const OPENAPI: &str = "/api/v1/openapi.json";
/// The prefix every API path above starts with.
pub const API_PREFIX: &str = "/api/v1";
