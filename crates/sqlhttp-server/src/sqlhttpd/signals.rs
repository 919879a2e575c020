//! The process signals `sqlhttpd` answers: Ctrl-C and SIGTERM shut it down
//! ([`shutdown_signal`]), SIGHUP reads the TLS files again ([`reload_on_hangup`]).
//!
//! Nothing here knows the flags or builds the server; it is handed what it acts on.

use sqlhttp_server::TlsReloader;

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// How long a SIGHUP's reading of the TLS files may take before it is abandoned.
#[cfg(unix)]
const RELOAD_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads the TLS files again on every SIGHUP, for as long as the server runs: on a thread of its
/// own, abandoned after [`RELOAD_WITHIN`] (a stuck mount must stall neither the async workers
/// nor shutdown).
#[cfg(unix)]
pub(crate) fn reload_on_hangup(reloader: TlsReloader) -> Result<(), String> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match reloader.reload_within(RELOAD_WITHIN).await {
                Ok(()) => tracing::info!("SIGHUP: TLS files read again; new connections use them"),
                Err(e) => tracing::error!(
                    error = %e,
                    "SIGHUP: the TLS files do not load; keeping the ones in use"
                ),
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn reload_on_hangup(_: TlsReloader) -> Result<(), String> {
    Ok(())
}
