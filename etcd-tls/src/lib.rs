//! etcd client TLS from PEM files: the one place both binaries (controller and agent) turn their
//! `--etcd-ca` / `--etcd-cert` / `--etcd-key` flags into etcd-client options.

use std::io;
use std::path::{Path, PathBuf};

use etcd_client::{Certificate, Identity, TlsOptions};

/// A TLS file that could not be read, named.
#[derive(Debug, thiserror::Error)]
#[error("cannot read etcd TLS file {}", path.display())]
pub struct TlsFileError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// TLS options for the given CA bundle and client certificate/key (all PEM), or `None` when neither a CA
/// nor a client certificate is given (plain HTTP endpoints).
pub fn tls_options(
    ca: Option<&Path>,
    cert_and_key: Option<(&Path, &Path)>,
) -> Result<Option<TlsOptions>, TlsFileError> {
    if ca.is_none() && cert_and_key.is_none() {
        return Ok(None);
    }
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsFileError {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut tls = TlsOptions::new();
    if let Some(ca) = ca {
        tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let Some((cert, key)) = cert_and_key {
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(Some(tls))
}
