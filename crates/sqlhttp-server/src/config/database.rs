//! Which database the server serves ([`Database`], parsed from its URL), the PostgreSQL
//! [`PostgresUrl`] with its client role, and the PostgreSQL streaming replicas that serve
//! verified reads ([`ReadReplicas`]): the `--database`, `--client-role` and `--read-replica`
//! flag group.
//!
//! Parsing only: nothing here connects to a database. The URL's TLS parameters are read in
//! [`super::postgres_tls`].

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::postgres_tls::{PgSsl, SslMode};
use crate::error::ServerError;

/// PostgreSQL streaming replicas that serve verified reads (see
/// `docs/adr/0039-read-replicas-and-bookmarks.md`), with defaults in [`ReadReplicas::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReplicas {
    /// Each replica's URL: its host, port, database and TLS settings (the server logs in there
    /// as its client role, whose password replicates from the primary; the URL's own role
    /// watches the replica's health and lag). Default: none, every request goes to the primary.
    pub urls: Vec<PostgresUrl>,
    /// A replica further behind the primary than this is skipped. Default 5 s.
    pub max_lag: Duration,
    /// How long a read that carries a bookmark waits for a replica to replay that far before
    /// the primary serves it instead. Default 100 ms.
    pub wait: Duration,
}

impl Default for ReadReplicas {
    fn default() -> Self {
        ReadReplicas {
            urls: Vec::new(),
            max_lag: Duration::from_secs(5),
            wait: Duration::from_millis(100),
        }
    }
}

/// Which database the server serves.
///
/// Parsed from a URL: `sqlite::memory:` for a private in-memory database, `sqlite:PATH` or
/// `sqlite://PATH` for a file (created when missing), `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`
/// (or `postgresql://`, with libpq's query parameters) for a PostgreSQL database.
///
/// ```
/// use std::path::PathBuf;
/// use sqlhttp_server::Database;
///
/// assert_eq!("sqlite::memory:".parse::<Database>().unwrap(), Database::Memory);
/// assert_eq!(
///     "sqlite://data/app.db".parse::<Database>().unwrap(),
///     Database::File(PathBuf::from("data/app.db"))
/// );
/// assert!(matches!(
///     "postgres://app@db.internal:5432/app".parse::<Database>().unwrap(),
///     Database::Postgres(_)
/// ));
/// assert!("mysql://localhost".parse::<Database>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Database {
    /// An in-memory database that lives as long as the server.
    #[default]
    Memory,
    /// A database file at this path.
    File(PathBuf),
    /// A PostgreSQL database (see `docs/adr/0018-postgresql-engine.md`).
    Postgres(PostgresUrl),
}

/// The login role client statements run as on PostgreSQL, unless configured otherwise.
pub const DEFAULT_CLIENT_ROLE: &str = "sqlhttp_client";

/// A PostgreSQL connection URL, and the role client statements log in as
/// ([`DEFAULT_CLIENT_ROLE`] unless [`PostgresUrl::with_client_role`] says otherwise). `Debug`
/// and `Display` never print the password.
///
/// The URL's own role prepares the database at start (it creates the client role and the
/// server's store); client statements never run as it. See `docs/adr/0020-postgresql-client-login.md`.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    url: String,
    /// `url` without the TLS parameters the server reads itself (`sslmode`, `sslrootcert`),
    /// which tokio-postgres does not know in full.
    driver: String,
    ssl: PgSsl,
    client_role: String,
}

impl PostgresUrl {
    /// The URL with its password, for the driver only (without the TLS parameters: see
    /// [`PostgresUrl::ssl`]).
    pub(crate) fn secret(&self) -> &str {
        &self.driver
    }

    /// The URL's TLS settings (`sslmode`, `sslrootcert`).
    pub(crate) fn ssl(&self) -> &PgSsl {
        &self.ssl
    }

    /// The role client statements log in as.
    pub fn client_role(&self) -> &str {
        &self.client_role
    }

    /// Client statements log in as `role`: a plain identifier (lowercase ASCII letters, digits
    /// and `_`, not starting with a digit, at most 63 bytes), so it needs no quoting; not one of
    /// PostgreSQL's reserved `pg_*` names, nor `_sqlhttp` (the server's schema, which would come
    /// first in the role's search path).
    ///
    /// ```
    /// use sqlhttp_server::Database;
    ///
    /// let Database::Postgres(url) = "postgres://admin@db/app".parse().unwrap() else {
    ///     unreachable!()
    /// };
    /// assert_eq!(url.client_role(), "sqlhttp_client");
    /// assert_eq!(url.clone().with_client_role("app_client").unwrap().client_role(), "app_client");
    /// assert!(url.clone().with_client_role("Robert'); DROP").is_err());
    /// assert!(url.with_client_role("pg_monitor").is_err());
    /// ```
    ///
    /// # Errors
    /// [`ServerError::InvalidClientRole`] when `role` is not such an identifier.
    pub fn with_client_role(mut self, role: &str) -> Result<PostgresUrl, ServerError> {
        let plain = !role.is_empty()
            && role.len() <= 63
            && !role.starts_with(|c: char| c.is_ascii_digit())
            && role
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !role.starts_with("pg_")
            && role != "_sqlhttp";
        if !plain {
            return Err(ServerError::InvalidClientRole {
                role: role.to_owned(),
            });
        }
        self.client_role = role.to_owned();
        Ok(self)
    }
}

impl std::fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `scheme://user:password@host` → `scheme://user:***@host`.
        let (scheme, rest) = self
            .url
            .split_once("://")
            .unwrap_or(("postgres", &self.url));
        match rest.split_once('@') {
            Some((userinfo, host)) if userinfo.contains(':') => {
                let user = userinfo.split(':').next().unwrap_or_default();
                write!(f, "{scheme}://{user}:***@{host}")
            }
            _ => write!(f, "{scheme}://{rest}"),
        }
    }
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PostgresUrl")
            .field(&self.to_string())
            .finish()
    }
}

/// Why a PostgreSQL URL is refused by a server built without the `postgres` feature.
#[cfg_attr(feature = "postgres", allow(dead_code))]
pub(crate) const NO_POSTGRES: &str = "this sqlhttpd was built without PostgreSQL support: build \
it with the default `postgres` feature (`cargo build -p sqlhttp-server`)";

impl FromStr for Database {
    type Err = ServerError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| ServerError::InvalidDatabaseUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut parsed = PostgresUrl {
                url: url.to_owned(),
                driver: url.to_owned(),
                ssl: PgSsl {
                    mode: SslMode::Prefer,
                    root_cert: None,
                },
                client_role: DEFAULT_CLIENT_ROLE.to_owned(),
            };
            let (driver, ssl) =
                PgSsl::split(url).map_err(|reason| ServerError::InvalidDatabaseUrl {
                    url: parsed.to_string(),
                    reason,
                })?;
            (parsed.driver, parsed.ssl) = (driver, ssl);
            #[cfg(not(feature = "postgres"))]
            return Err(ServerError::InvalidDatabaseUrl {
                url: parsed.to_string(),
                reason: NO_POSTGRES.to_owned(),
            });
            #[cfg(feature = "postgres")]
            return match parsed.driver.parse::<tokio_postgres::Config>() {
                Ok(_) => Ok(Database::Postgres(parsed)),
                // The driver's message never quotes the password.
                Err(e) => Err(ServerError::InvalidDatabaseUrl {
                    url: parsed.to_string(),
                    reason: e.to_string(),
                }),
            };
        }
        let rest = url.strip_prefix("sqlite:").ok_or_else(|| {
            invalid(
                "expected `sqlite::memory:`, `sqlite:PATH`, `sqlite://PATH` or \
                 `postgres://USER@HOST:PORT/DB`",
            )
        })?;
        let path = rest.strip_prefix("//").unwrap_or(rest);
        match path {
            "" => Err(invalid("the path is empty")),
            ":memory:" => Ok(Database::Memory),
            path => Ok(Database::File(PathBuf::from(path))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls() {
        assert_eq!(
            Database::from_str("sqlite::memory:").unwrap(),
            Database::Memory
        );
        assert_eq!(
            Database::from_str("sqlite://:memory:").unwrap(),
            Database::Memory
        );
        assert_eq!(
            Database::from_str("sqlite:app.db").unwrap(),
            Database::File(PathBuf::from("app.db"))
        );
        assert_eq!(
            Database::from_str("sqlite:///var/lib/app.db").unwrap(),
            Database::File(PathBuf::from("/var/lib/app.db"))
        );
        for bad in [
            "",
            "sqlite:",
            "sqlite://",
            "app.db",
            "mysql://x",
            "postgres://x:1:2:3/",
            "SQLITE:app.db",
        ] {
            let err = Database::from_str(bad).unwrap_err();
            assert!(
                matches!(err, ServerError::InvalidDatabaseUrl { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn postgres_urls_hide_their_password() {
        let Database::Postgres(url) =
            Database::from_str("postgresql://app:s3cret@db:5432/app?sslmode=disable").unwrap()
        else {
            panic!("a PostgreSQL URL")
        };
        assert_eq!(
            url.to_string(),
            "postgresql://app:***@db:5432/app?sslmode=disable"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(url.secret().contains("s3cret"));
        let plain = Database::from_str("postgres://postgres@127.0.0.1:5432/postgres").unwrap();
        assert!(format!("{plain:?}").contains("postgres@127.0.0.1:5432"));
    }
}
