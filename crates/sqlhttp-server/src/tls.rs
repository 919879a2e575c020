//! HTTPS for clients: the rustls server configuration built from [`TlsFiles`] (certificate
//! chain, key, and for mutual TLS the CAs that sign client certificates), offering `h2` and
//! `http/1.1` by ALPN, and [`TlsReloader`], which reads the files again (`SIGHUP` in `sqlhttpd`)
//! and swaps the configuration in for new handshakes only: open connections keep the session
//! they made, and files that do not load leave the running configuration in place.
//! [`TlsReloader::reload_within`] reads them on a thread of its own and gives up after a bound
//! (a path on a stuck network mount, a FIFO nobody writes), so neither the async workers, nor
//! the probes they answer, nor shutdown ever wait on a file (ADR 0044).
//!
//! Knows rustls and files; nothing about HTTP framing, routes or the engine (see `server`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::config::TlsFiles;
use crate::error::ServerError;

/// ALPN's name of HTTP/2.
pub(crate) const H2: &[u8] = b"h2";

/// The files and the configuration made of them last.
#[derive(Debug)]
struct Current {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
    /// A [`TlsReloader::reload_within`] thread is still reading the files (perhaps abandoned).
    reading: AtomicBool,
}

/// Reads a server's TLS files again and uses them for the handshakes that follow; open
/// connections are not touched. Cloned handles share one configuration.
///
/// ```no_run
/// # async fn run(config: sqlhttp_server::Config) -> Result<(), sqlhttp_server::ServerError> {
/// let server = sqlhttp_server::Server::bind(config).await?;
/// if let Some(reloader) = server.tls_reloader() {
///     // After the certificate files were renewed:
///     reloader.reload()?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TlsReloader {
    current: Arc<Current>,
}

impl TlsReloader {
    /// Reads `files` and builds the first configuration.
    pub(crate) fn load(files: &TlsFiles) -> Result<TlsReloader, ServerError> {
        let config = build(files)?;
        Ok(TlsReloader {
            current: Arc::new(Current {
                files: files.clone(),
                config: RwLock::new(config),
                reading: AtomicBool::new(false),
            }),
        })
    }

    /// Reads the certificate, key and client CA files again; new handshakes use them. Blocks
    /// the calling thread while it reads, for as long as the files take: from async code, call
    /// [`reload_within`](TlsReloader::reload_within).
    ///
    /// # Errors
    /// [`ServerError::TlsFile`] when a file cannot be read or used (the key does not match the
    /// certificate, say): the configuration in use stays.
    pub fn reload(&self) -> Result<(), ServerError> {
        let config = build(&self.current.files)?;
        *self
            .current
            .config
            .write()
            .unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }

    /// Reads the files as [`reload`](TlsReloader::reload) does, on a thread of its own, and
    /// waits at most `bound` for it: a read that takes longer (a file on a stuck mount, a FIFO)
    /// is abandoned and the configuration in use stays, even if the read ends later. While an
    /// abandoned read is still stuck, another reload is refused at once rather than starting a
    /// second thread.
    ///
    /// # Errors
    /// [`ServerError::TlsFile`] as for `reload`, also when the files were not read within
    /// `bound` or a previous read is still stuck.
    pub async fn reload_within(&self, bound: Duration) -> Result<(), ServerError> {
        let current = &self.current;
        let files = &current.files;
        if current.reading.swap(true, Ordering::AcqRel) {
            return Err(file_error(
                &files.cert,
                "a previous reload is still reading the TLS files; not read again",
            ));
        }
        let (done, built) = tokio::sync::oneshot::channel();
        let reader = Arc::clone(current);
        let spawned = std::thread::Builder::new()
            .name("sqlhttpd-tls-reload".into())
            .spawn(move || {
                let config = build(&reader.files);
                reader.reading.store(false, Ordering::Release);
                let _ = done.send(config);
            });
        if let Err(e) = spawned {
            current.reading.store(false, Ordering::Release);
            return Err(file_error(
                &files.cert,
                format!("cannot start a thread to read the TLS files: {e}"),
            ));
        }
        let config = match tokio::time::timeout(bound, built).await {
            Ok(Ok(config)) => config?,
            Ok(Err(_)) => {
                return Err(file_error(
                    &files.cert,
                    "the thread reading the TLS files ended without an answer",
                ));
            }
            Err(_) => {
                return Err(file_error(
                    &files.cert,
                    format!(
                        "the TLS files (or the client CA) were not read within {} ms; abandoned",
                        bound.as_millis()
                    ),
                ));
            }
        };
        *current
            .config
            .write()
            .unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }

    /// An acceptor with the configuration in use now.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .current
            .config
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        tokio_rustls::TlsAcceptor::from(Arc::clone(&config))
    }
}

fn file_error(path: &Path, reason: impl Into<String>) -> ServerError {
    ServerError::TlsFile {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, ServerError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error(
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// The configuration `files` describe: the chain and key, ALPN `h2` then `http/1.1`, and a
/// client certificate required and checked when `client_ca` is set.
fn build(files: &TlsFiles) -> Result<Arc<ServerConfig>, ServerError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        file_error(
            &files.key,
            format!("{e} (a PEM private key: PKCS#8, PKCS#1 or SEC1)"),
        )
    })?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| file_error(&files.cert, e.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path)? {
                roots
                    .add(cert)
                    .map_err(|e| file_error(path, format!("not a CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| file_error(path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        file_error(
            &files.key,
            format!(
                "does not go with the certificate in {}: {e}",
                files.cert.display()
            ),
        )
    })?;
    config.alpn_protocols = vec![H2.to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
