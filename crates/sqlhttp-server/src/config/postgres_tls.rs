//! The TLS parameters of a PostgreSQL URL (libpq's `sslmode` and `sslrootcert`), taken out of
//! its query string with libpq's rules before the rest goes to the driver.
//!
//! Parsing only: the TLS connector that applies them lives in the PostgreSQL engine.

use std::path::PathBuf;

/// libpq's `sslmode`: whether the server's connections to PostgreSQL use TLS, and what they
/// check (see `docs/adr/0033-tls-both-ways.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when PostgreSQL offers it, else plain (libpq's default, and the server's).
    Prefer,
    /// TLS or nothing; the certificate is not checked (unless `sslrootcert` names a file).
    Require,
    /// TLS, the certificate signed by a trusted CA.
    VerifyCa,
    /// TLS, the certificate signed by a trusted CA and issued for the URL's host.
    VerifyFull,
}

/// libpq's `sslrootcert`: the CAs a certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// `sslrootcert=system`: the built-in roots (Mozilla's, compiled in); forces `verify-full`.
    System,
    /// A PEM file of CA certificates.
    File(PathBuf),
}

/// The TLS parameters of a PostgreSQL URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgSsl {
    pub(crate) mode: SslMode,
    /// `None`: not given (the built-in roots, for `verify-ca` and `verify-full` only).
    pub(crate) root_cert: Option<RootCert>,
}

impl PgSsl {
    /// Takes `sslmode` and `sslrootcert` out of `url`'s query string: the URL left for the
    /// driver, and the settings, with libpq's rules (`sslrootcert=system` means `verify-full`
    /// and refuses a weaker mode).
    pub(super) fn split(url: &str) -> Result<(String, PgSsl), String> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut mode = None;
        let mut root_cert = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match percent_decode(key)?.as_str() {
                "sslmode" => {
                    mode = Some(match percent_decode(value)?.as_str() {
                        "disable" => SslMode::Disable,
                        "prefer" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        "allow" => {
                            return Err(
                                "sslmode=allow is not supported: use prefer or disable".to_owned()
                            );
                        }
                        other => {
                            return Err(format!(
                                "sslmode={other} is not one of disable, prefer, require, \
                                 verify-ca, verify-full"
                            ));
                        }
                    });
                }
                "sslrootcert" => {
                    root_cert = Some(match percent_decode(value)?.as_str() {
                        "" => return Err("sslrootcert is empty".to_owned()),
                        "system" => RootCert::System,
                        path => RootCert::File(PathBuf::from(path)),
                    });
                }
                "sslnegotiation" if percent_decode(value)? == "direct" => {
                    return Err("sslnegotiation=direct is not supported: leave it out (the \
                                server asks PostgreSQL for TLS first, as libpq does by default)"
                        .to_owned());
                }
                "channel_binding" if percent_decode(value)? == "require" => {
                    return Err(
                        "channel_binding=require is not supported (the server's TLS \
                                does not bind SCRAM to the channel): leave it out, and use \
                                sslmode=verify-full"
                            .to_owned(),
                    );
                }
                _ => kept.push(pair),
            }
        }
        let mode = match (mode, &root_cert) {
            (None, Some(RootCert::System)) | (Some(SslMode::VerifyFull), _) => SslMode::VerifyFull,
            (Some(weaker), Some(RootCert::System)) => {
                return Err(format!(
                    "sslrootcert=system takes sslmode=verify-full (libpq's rule: anyone can get a \
                     publicly trusted certificate for a name they control), not {}",
                    weaker.name()
                ));
            }
            (Some(mode), _) => mode,
            (None, _) => SslMode::Prefer,
        };
        let driver = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((driver, PgSsl { mode, root_cert }))
    }
}

impl SslMode {
    /// The mode as the URL spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A URL query's `%XX` escapes decoded (`+` stays itself, as libpq reads it).
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("invalid percent-encoding in {text:?}"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;
    use crate::config::Database;
    use crate::error::ServerError;

    fn ssl_of(url: &str) -> Result<PgSsl, ServerError> {
        match Database::from_str(url)? {
            Database::Postgres(url) => Ok(url.ssl().clone()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sslmode_and_sslrootcert_follow_libpq() {
        let base = "postgres://app:pw@db.example:5432/app";
        let ssl = ssl_of(base).unwrap();
        assert_eq!((ssl.mode, ssl.root_cert), (SslMode::Prefer, None));
        for (mode, expected) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            assert_eq!(
                ssl_of(&format!("{base}?sslmode={mode}")).unwrap().mode,
                expected
            );
        }
        // A file, percent-decoded; the other parameters stay the driver's.
        let Database::Postgres(url) = Database::from_str(&format!(
            "{base}?application_name=x&sslmode=verify-ca&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3"
        ))
        .unwrap() else {
            panic!("PostgreSQL")
        };
        assert_eq!(
            url.ssl().root_cert,
            Some(RootCert::File(PathBuf::from("/etc/ca.pem")))
        );
        assert_eq!(
            url.secret(),
            format!("{base}?application_name=x&connect_timeout=3")
        );
        assert!(url.to_string().contains("sslmode=verify-ca"), "{url}");
        // `system` means verify-full and refuses weaker modes, as libpq 16 does.
        let system = ssl_of(&format!("{base}?sslrootcert=system")).unwrap();
        assert_eq!(
            (system.mode, system.root_cert),
            (SslMode::VerifyFull, Some(RootCert::System))
        );
        for weak in ["require", "verify-ca", "prefer", "disable"] {
            let e = ssl_of(&format!("{base}?sslmode={weak}&sslrootcert=system")).unwrap_err();
            assert!(e.to_string().contains("verify-full"), "{e}");
        }
        for (bad, says) in [
            ("sslmode=allow", "use prefer or disable"),
            ("sslmode=verify", "not one of"),
            ("sslrootcert=", "empty"),
            ("sslnegotiation=direct", "not supported"),
            ("channel_binding=require", "not supported"),
            ("sslmode=%zz", "percent-encoding"),
        ] {
            let e = ssl_of(&format!("{base}?{bad}")).unwrap_err();
            assert!(
                matches!(e, ServerError::InvalidDatabaseUrl { .. }) && e.to_string().contains(says),
                "{bad}: {e}"
            );
            assert!(!e.to_string().contains(":pw@"), "{e}");
        }
    }
}
