//! TLS to Redis: the files of the config's `[tls]` table (`TlsFiles`: a CA
//! to trust, and a client certificate for mutual TLS), read once at
//! connect into what the
//! inventory cluster's client and every lock node's client are built with.
//! Why a module of its own: the cluster and the lock nodes share it, the
//! files are read in one place (so no error ever carries their contents),
//! and a build without the `tls` feature builds every client from its
//! URL alone (`Config::validate` refuses `rediss://` there).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A `[tls]` file or pair of files that cannot be used: which key, and why
/// (never what the file holds). `Config::validate` and `Engine::connect`
/// give it as a `crate::ConfigError` of the same field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct TlsFileError {
    /// The key, as spelled in the config file (`tls.ca_file`).
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl TlsFileError {
    fn new(field: &'static str, problem: impl Into<String>) -> Self {
        TlsFileError {
            field,
            problem: problem.into(),
        }
    }
}

/// The `[tls]` table: which files make the connections to `rediss://`
/// nodes (cluster and lock nodes alike). Every field optional: with no
/// `ca_file` the system's roots are trusted; `cert_file` and `key_file`
/// go together, for servers that ask clients for a certificate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFiles {
    /// PEM file of the CA certificates that sign the servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// PEM file of this client's certificate (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key (mutual TLS).
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// Checks the table: a client certificate needs its key, and a key its
    /// certificate. The files are read at connect.
    pub fn validate(&self) -> Result<(), TlsFileError> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => Err(TlsFileError::new(
                "tls.key_file",
                "tls.cert_file is set: its private key is needed too",
            )),
            (None, Some(_)) => Err(TlsFileError::new(
                "tls.cert_file",
                "tls.key_file is set: the certificate it belongs to is needed too",
            )),
            _ => Ok(()),
        }
    }

    /// What a connection to a `rediss://` node will check, in words, for
    /// `flashsale config check`.
    pub fn describe(&self) -> String {
        let roots = match &self.ca_file {
            Some(ca) => format!("the CA certificates in {}", ca.display()),
            None => "the system's root certificates".to_owned(),
        };
        let client = match &self.cert_file {
            Some(cert) => format!("; presents the client certificate {}", cert.display()),
            None => "; presents no client certificate".to_owned(),
        };
        format!(
            "rediss:// nodes: verifies each server's certificate and host name \
             against {roots}{client}"
        )
    }
}

/// The `[tls]` files read, ready to build clients with. Empty (every
/// client built from its URL alone) when no file is given or the build has
/// no TLS.
#[derive(Clone, Default)]
pub struct Certificates {
    #[cfg(feature = "tls")]
    inner: Option<redis::TlsCertificates>,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The contents are never printed, only whether there are any.
        f.debug_struct("Certificates")
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

impl Certificates {
    /// Reads the files of `files`. An error names the field and the path,
    /// never what the file holds.
    pub fn load(files: &TlsFiles) -> Result<Certificates, TlsFileError> {
        files.validate()?;
        #[cfg(feature = "tls")]
        {
            install_crypto_provider();
            if files.ca_file.is_none() && files.cert_file.is_none() {
                return Ok(Certificates { inner: None });
            }
            let root_cert = match &files.ca_file {
                Some(p) => Some(read_pem("tls.ca_file", p)?),
                None => None,
            };
            let client_tls = match (&files.cert_file, &files.key_file) {
                (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                    client_cert: read_pem("tls.cert_file", c)?,
                    client_key: read_pem("tls.key_file", k)?,
                }),
                _ => None,
            };
            Ok(Certificates {
                inner: Some(redis::TlsCertificates {
                    client_tls,
                    root_cert,
                }),
            })
        }
        #[cfg(not(feature = "tls"))]
        {
            Ok(Certificates::default())
        }
    }

    /// Whether any file was read.
    pub fn is_loaded(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.inner.is_some()
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }

    /// A client for one node (a lock node): with these certificates when
    /// the URL is `rediss://` and files were read, else from the URL alone.
    pub(crate) fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let (Some(certs), true) = (&self.inner, url.starts_with("rediss://")) {
            return redis::Client::build_with_tls(url, certs.clone());
        }
        redis::Client::open(url)
    }

    /// The cluster client's builder, with these certificates when the
    /// nodes are `rediss://` and files were read.
    pub(crate) fn cluster_builder(
        &self,
        builder: redis::cluster::ClusterClientBuilder,
        tls_nodes: bool,
    ) -> redis::cluster::ClusterClientBuilder {
        #[cfg(feature = "tls")]
        if let (Some(certs), true) = (&self.inner, tls_nodes) {
            return builder.certs(certs.clone());
        }
        let _ = tls_nodes;
        builder
    }
}

/// rustls needs one process-wide crypto provider; ring is the one built in.
/// Installing it twice (another library did first) is not an error.
#[cfg(feature = "tls")]
pub(crate) fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The file at `path`, which must hold PEM text. Its contents never reach
/// an error: a key is a secret.
#[cfg(feature = "tls")]
fn read_pem(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let bytes = std::fs::read(path).map_err(|e| {
        TlsFileError::new(
            field,
            format!("{} could not be read: {}", path.display(), e.kind()),
        )
    })?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(TlsFileError::new(
            field,
            format!("{} holds no PEM block", path.display()),
        ));
    }
    Ok(bytes)
}

#[cfg(not(feature = "tls"))]
#[allow(dead_code)]
fn read_pem(_field: &'static str, _path: &Path) -> Result<Vec<u8>, TlsFileError> {
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_certificate_needs_its_key_and_the_reverse() {
        let half = TlsFiles {
            cert_file: Some("c.pem".into()),
            ..TlsFiles::default()
        };
        assert_eq!(half.validate().unwrap_err().field, "tls.key_file");
        let half = TlsFiles {
            key_file: Some("k.pem".into()),
            ..TlsFiles::default()
        };
        assert_eq!(half.validate().unwrap_err().field, "tls.cert_file");
        assert!(TlsFiles::default().validate().is_ok());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_key_file_s_contents_never_reach_an_error() {
        let dir = std::env::temp_dir().join(format!("flashsale-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let key = dir.join("key.pem");
        std::fs::write(&key, "S3cretKeyMaterial not a pem").expect("write");
        let files = TlsFiles {
            cert_file: Some(key.clone()),
            key_file: Some(key.clone()),
            ..TlsFiles::default()
        };
        let e = Certificates::load(&files).unwrap_err();
        assert!(e.problem.contains("no PEM block"), "{e}");
        assert!(!e.to_string().contains("S3cret"), "{e}");
        let missing = TlsFiles {
            ca_file: Some(dir.join("absent.pem")),
            ..TlsFiles::default()
        };
        let e = Certificates::load(&missing).unwrap_err();
        assert_eq!(e.field, "tls.ca_file");
        assert!(e.problem.contains("could not be read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
