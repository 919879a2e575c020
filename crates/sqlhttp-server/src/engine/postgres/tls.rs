//! TLS on the server's connections to PostgreSQL, as libpq's `sslmode` and `sslrootcert` say
//! (ADR 0033): [`PgTls`] is built once at start from the URL's settings (the CA file read then),
//! and [`PgTls::negotiate`] turns a freshly opened TCP socket into the stream a session (or a
//! cancel request) runs over: it sends PostgreSQL's `SSLRequest` itself, reads the one-byte
//! answer, and runs the rustls handshake, so tokio-postgres always sees a plain stream
//! (configured `sslmode=disable`) and `wire`'s framing reads the decrypted bytes.
//!
//! What each mode checks: `disable` sends no request; `prefer` takes TLS when offered and goes
//! on in plain text when PostgreSQL declines it, or when the handshake fails (on a new socket,
//! as libpq does); `require` insists on TLS and checks nothing, unless `sslrootcert` names a
//! file (then it checks the chain, libpq's compatibility rule); `verify-ca` checks the chain;
//! `verify-full` the chain and the URL's host. Without `sslrootcert` the roots are Mozilla's,
//! compiled in (`webpki-root-certs`), so a `FROM scratch` image verifies a public CA.
//! Handshake failures become messages that say which check failed and what to change.
//!
//! Knows sockets, rustls and PostgreSQL's TLS request; nothing about sessions, requests or HTTP.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_postgres::Config;
use tokio_postgres::config::Host;

use crate::config::{PgSsl, RootCert, SslMode};

/// PostgreSQL's `SSLRequest`: length 8, then the code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// How long the TLS request and handshake may take when the URL sets no `connect_timeout`.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// The TLS settings every connection to one PostgreSQL uses: the pool's, the set-up's, the role
/// keeper's, the reaper's and cancel requests.
pub(crate) struct PgTls {
    mode: SslMode,
    /// `None` for `disable`.
    config: Option<Arc<ClientConfig>>,
    /// Where the trusted CAs come from, for messages: `sslrootcert=/path`, or the built-in roots.
    roots: String,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls")
            .field("mode", &self.mode)
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

/// What [`PgTls::negotiate`] made of a socket.
#[derive(Debug)]
pub(crate) enum Negotiated {
    /// TLS is up.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// Plain text on this socket (`disable`, or `prefer` that PostgreSQL declined).
    Plain(TcpStream),
    /// `prefer` whose handshake failed: plain text, on a socket opened again (this one is
    /// spent).
    Reopen,
}

impl PgTls {
    /// The settings of a URL; reads `sslrootcert`'s file.
    ///
    /// # Errors
    /// A message naming the file when it cannot be read or holds no certificate.
    pub(crate) fn new(ssl: &PgSsl) -> Result<PgTls, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let (roots, described, check_chain) = match &ssl.root_cert {
            Some(RootCert::File(path)) => {
                let mut store = RootCertStore::empty();
                let mut found = 0;
                for cert in CertificateDer::pem_file_iter(path)
                    .map_err(|e| format!("cannot read sslrootcert={}: {e}", path.display()))?
                {
                    let cert = cert
                        .map_err(|e| format!("cannot read sslrootcert={}: {e}", path.display()))?;
                    store.add(cert).map_err(|e| {
                        format!(
                            "sslrootcert={} holds a certificate that is not a CA's: {e}",
                            path.display()
                        )
                    })?;
                    found += 1;
                }
                if found == 0 {
                    return Err(format!(
                        "sslrootcert={} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        path.display()
                    ));
                }
                // libpq checks the chain whenever it has a root file, even for `require`.
                (store, format!("sslrootcert={}", path.display()), true)
            }
            Some(RootCert::System) | None => {
                let mut store = RootCertStore::empty();
                store.add_parsable_certificates(
                    webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned(),
                );
                let described = if ssl.root_cert.is_some() {
                    "sslrootcert=system (the built-in roots, Mozilla's)".to_owned()
                } else {
                    "the built-in roots (Mozilla's; no sslrootcert given)".to_owned()
                };
                (store, described, false)
            }
        };
        let verifier = Verifier {
            roots: match ssl.mode {
                SslMode::VerifyCa | SslMode::VerifyFull => Some(Arc::new(roots)),
                SslMode::Require | SslMode::Prefer if check_chain => Some(Arc::new(roots)),
                _ => None,
            },
            check_name: ssl.mode == SslMode::VerifyFull,
            algorithms: provider.signature_verification_algorithms,
        };
        let config = if ssl.mode == SslMode::Disable {
            None
        } else {
            let mut config = ClientConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("cannot set up TLS: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth();
            // As libpq 17 sends it; servers that do not know ALPN ignore it.
            config.alpn_protocols = vec![b"postgresql".to_vec()];
            Some(Arc::new(config))
        };
        Ok(PgTls {
            mode: ssl.mode,
            config,
            roots: described,
        })
    }

    /// Asks PostgreSQL for TLS on `socket` (to host `index` of `config`) and runs the handshake,
    /// within the URL's `connect_timeout` (10 s without one).
    ///
    /// # Errors
    /// An error whose message says what failed and what to change: PostgreSQL declined TLS
    /// that the mode requires, the certificate is not trusted, or not issued for the host.
    pub(crate) async fn negotiate(
        &self,
        mut socket: TcpStream,
        config: &Config,
        index: usize,
    ) -> io::Result<Negotiated> {
        let Some(tls) = &self.config else {
            return Ok(Negotiated::Plain(socket));
        };
        let (name, shown) = server_name(config, index)?;
        let within = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(HANDSHAKE_WITHIN);
        let negotiated = tokio::time::timeout(within, async {
            socket.write_all(&SSL_REQUEST).await?;
            match socket.read_u8().await? {
                b'S' => {}
                b'N' if self.mode == SslMode::Prefer => return Ok(Negotiated::Plain(socket)),
                b'N' => {
                    return Err(refused(format!(
                        "TLS to {shown}: PostgreSQL does not accept TLS (ssl = off), and \
                         sslmode={} asks for it: turn ssl on in postgresql.conf, or connect \
                         with sslmode=prefer or disable",
                        self.mode.name()
                    )));
                }
                other => {
                    return Err(refused(format!(
                        "TLS to {shown}: PostgreSQL answered the TLS request with {:?}, not S \
                         or N: is this a PostgreSQL server?",
                        char::from(other)
                    )));
                }
            }
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
            match connector.connect(name, socket).await {
                Ok(stream) => Ok(Negotiated::Tls(Box::new(stream))),
                Err(e) if self.mode == SslMode::Prefer => {
                    tracing::warn!(
                        host = %shown,
                        error = %self.explain(&e, &shown),
                        "the TLS handshake with PostgreSQL failed: sslmode=prefer goes on in \
                         plain text"
                    );
                    Ok(Negotiated::Reopen)
                }
                Err(e) => Err(refused(self.explain(&e, &shown))),
            }
        })
        .await;
        negotiated.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "TLS to {shown}: no TLS answer within {} s (connect_timeout)",
                    within.as_secs()
                ),
            ))
        })
    }

    /// What to add to PostgreSQL's refusal of a login made without TLS that it wants over TLS
    /// (`hostssl` lines only in `pg_hba.conf`: "no pg_hba.conf entry ..., no encryption").
    pub(crate) fn hint(&self, e: &tokio_postgres::Error) -> Option<String> {
        let db = e.as_db_error()?;
        (self.mode == SslMode::Disable
            && *db.code() == tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            && db.message().ends_with("no encryption"))
        .then(|| {
            "PostgreSQL takes this login over TLS only, and the URL says sslmode=disable: use \
             sslmode=verify-full (or require)"
                .to_owned()
        })
    }

    /// What a failed handshake means, and what to do about it.
    fn explain(&self, e: &io::Error, shown: &str) -> String {
        let roots = &self.roots;
        let why = match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            Some(rustls::Error::InvalidCertificate(cert)) => match cert {
                CertificateError::UnknownIssuer => format!(
                    "the server's certificate is not signed by a CA in {roots}: pass the CA \
                     that signed it (sslrootcert=FILE)"
                ),
                CertificateError::NotValidForNameContext {
                    expected,
                    presented,
                } => format!(
                    "name mismatch: the certificate is for {}, the URL's host is {}: use the \
                     name in the certificate as the host, or sslmode=verify-ca (which checks \
                     the CA only)",
                    presented
                        .iter()
                        .map(|name| plain_name(name))
                        .collect::<Vec<_>>()
                        .join(", "),
                    expected.to_str()
                ),
                CertificateError::NotValidForName => format!(
                    "name mismatch: the certificate is not for the URL's host {shown}: use the \
                     name in the certificate as the host, or sslmode=verify-ca"
                ),
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "the server's certificate has expired: renew it on the server".to_owned()
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "the server's certificate is not valid yet: check the clocks, or the \
                     certificate's dates"
                        .to_owned()
                }
                other => format!("the server's certificate is refused: {other:?}"),
            },
            Some(rustls::Error::AlertReceived(alert)) => {
                format!("PostgreSQL ended the TLS handshake ({alert:?})")
            }
            Some(other) => format!("the TLS handshake failed: {other}"),
            None => format!("the TLS handshake failed: {e}"),
        };
        format!("TLS to {shown} (sslmode={}): {why}", self.mode.name())
    }
}

/// A name as rustls presents it (`DnsName("db.example")`, `IpAddress(10.0.0.1)`), as the
/// URL would write it.
fn plain_name(presented: &str) -> &str {
    presented
        .strip_prefix("DnsName(\"")
        .and_then(|rest| rest.strip_suffix("\")"))
        .or_else(|| {
            presented
                .strip_prefix("IpAddress(")
                .and_then(|rest| rest.strip_suffix(')'))
        })
        .unwrap_or(presented)
}

/// An error that ends the attempt (no other address of the host is better).
fn refused(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionRefused, message)
}

/// The name the certificate is checked against (and sent as SNI): host `index`'s name, else its
/// `hostaddr`; and how to show the host in messages.
fn server_name(config: &Config, index: usize) -> io::Result<(ServerName<'static>, String)> {
    let port = match config.get_ports() {
        [] => 5432,
        [one] => *one,
        many => many.get(index).copied().unwrap_or(5432),
    };
    let name = match (
        config.get_hosts().get(index),
        config.get_hostaddrs().get(index),
    ) {
        (Some(Host::Tcp(name)), _) => name.clone(),
        (_, Some(addr)) => addr.to_string(),
        _ => String::new(),
    };
    let server = match name.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(name.clone()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TLS: {name:?} is not a host name a certificate can be checked against"),
            )
        })?,
    };
    Ok((server, format!("{name}:{port}")))
}

/// Checks the server's certificate as the mode asks: the chain against `roots` (when set) and
/// the host name (when `check_name`); the handshake's signatures always.
#[derive(Debug)]
struct Verifier {
    roots: Option<Arc<RootCertStore>>,
    check_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(roots) = &self.roots else {
            // `require` (and `prefer`) without a root file: encrypted, not authenticated.
            return Ok(ServerCertVerified::assertion());
        };
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        if self.check_name {
            rustls::client::verify_server_name(&cert, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presented_names_read_as_urls_write_them() {
        assert_eq!(plain_name("DnsName(\"db.example\")"), "db.example");
        assert_eq!(plain_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(plain_name("DirectoryName"), "DirectoryName");
    }

    #[test]
    fn a_root_file_that_is_missing_or_empty_is_named() {
        let ssl = |path: &std::path::Path| PgSsl {
            mode: SslMode::VerifyFull,
            root_cert: Some(RootCert::File(path.to_owned())),
        };
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = PgTls::new(&ssl(&missing)).unwrap_err();
        assert!(
            e.contains("cannot read sslrootcert=") && e.contains("missing.pem"),
            "{e}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = PgTls::new(&ssl(&empty)).unwrap_err();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        // The built-in roots need no file.
        let builtin = PgTls::new(&PgSsl {
            mode: SslMode::VerifyFull,
            root_cert: None,
        })
        .unwrap();
        assert!(builtin.roots.contains("built-in"));
    }
}
