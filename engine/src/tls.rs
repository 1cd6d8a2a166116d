//! TLS to Redis: the files of the config's `[tls]` table (`TlsFiles`: a CA
//! to trust, and a client certificate for mutual TLS), read once at
//! connect into what the
//! inventory cluster's client and every lock node's client are built with.
//! Why a module of its own: the cluster and the lock nodes share it, the
//! files are read in one place (so no error ever carries their contents),
//! and a build without the `tls` feature builds every client from its
//! URL alone (`Config::validate` refuses `rediss://` there).

use std::path::PathBuf;

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
        // Paths quoted and escaped: `config check` prints this as a comment
        // line of its TOML output, which a newline in a path would end.
        let roots = match &self.ca_file {
            Some(ca) => format!("the CA certificates in {:?}", ca.display().to_string()),
            None => "the system's root certificates".to_owned(),
        };
        let client = match &self.cert_file {
            Some(cert) => format!(
                "; presents the client certificate {:?}",
                cert.display().to_string()
            ),
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
                Some(p) => Some(read_pem("tls.ca_file", p, Pem::Certificates)?),
                None => None,
            };
            let client_tls = match (&files.cert_file, &files.key_file) {
                (Some(c), Some(k)) => {
                    let client_cert = read_pem("tls.cert_file", c, Pem::Certificates)?;
                    let client_key = read_pem("tls.key_file", k, Pem::PrivateKey)?;
                    keys_match(&client_cert, &client_key)?;
                    Some(redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    })
                }
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

    /// A client for one node (a lock node, or one node of the cluster on a
    /// connection of its own): with these certificates when the URL is
    /// `rediss://` and files were read, else from the URL alone.
    pub fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
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

/// The client key must be the certificate's: a swapped pair would
/// otherwise pass `config check` and fail only at the first handshake, as
/// a refusal from the server that names neither file.
#[cfg(feature = "tls")]
fn keys_match(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsFileError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mismatch = || {
        TlsFileError::new(
            "tls.key_file",
            "is not the private key of tls.cert_file's certificate",
        )
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| mismatch())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| mismatch())?;
    rustls::sign::CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
        .map(|_| ())
        .map_err(|_| mismatch())
}

/// What a `[tls]` file must hold.
#[cfg(feature = "tls")]
#[derive(Clone, Copy)]
enum Pem {
    /// One or more certificates.
    Certificates,
    /// One private key (PKCS#8, PKCS#1 or SEC1, unencrypted).
    PrivateKey,
}

/// Largest `[tls]` file read: a bundle of every public root is about
/// 220 KB; a path to something else (a device, a log) is refused before
/// it is read whole.
#[cfg(feature = "tls")]
const MAX_PEM_BYTES: u64 = 1 << 20;

/// At most [`MAX_PEM_BYTES`] of the file at `path`, read with the bound
/// on the read itself: a size from `stat` proves nothing (a `/proc` file
/// says 0 and never ends; a file can be swapped after the `stat`). `None`
/// for a file larger than the bound.
#[cfg(feature = "tls")]
pub(crate) fn read_bounded(path: &std::path::Path) -> Result<Vec<u8>, Option<std::io::ErrorKind>> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| Some(e.kind()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Some(e.kind()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(None);
    }
    Ok(bytes)
}

/// The file at `path`, which must be a regular file holding what `what`
/// says, parsed here with rustls' own PEM types (the ones redis-rs parses
/// it with again) so that nothing the file holds can reach an error: a
/// parser's error carries the text it stopped at, and in a key file that
/// is the key.
#[cfg(feature = "tls")]
fn read_pem(
    field: &'static str,
    path: &std::path::Path,
    what: Pem,
) -> Result<Vec<u8>, TlsFileError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let shown = format!("{:?}", path.display().to_string());
    let meta = std::fs::metadata(path).map_err(|e| {
        TlsFileError::new(field, format!("{shown} could not be read: {}", e.kind()))
    })?;
    if !meta.is_file() {
        return Err(TlsFileError::new(
            field,
            format!("{shown} is not a regular file"),
        ));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(TlsFileError::new(
            field,
            format!("{shown} is larger than {MAX_PEM_BYTES} bytes"),
        ));
    }
    let bytes = read_bounded(path).map_err(|e| match e {
        Some(kind) => TlsFileError::new(field, format!("{shown} could not be read: {kind}")),
        None => TlsFileError::new(
            field,
            format!("{shown} is larger than {MAX_PEM_BYTES} bytes"),
        ),
    })?;
    let parsed = match what {
        Pem::Certificates => {
            let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
            certs.is_ok_and(|c| !c.is_empty())
        }
        Pem::PrivateKey => PrivateKeyDer::from_pem_slice(&bytes).is_ok(),
    };
    if !parsed {
        let expected = match what {
            Pem::Certificates => "PEM certificates (-----BEGIN CERTIFICATE-----)",
            Pem::PrivateKey => "an unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1)",
        };
        return Err(TlsFileError::new(
            field,
            format!("{shown} does not hold {expected}"),
        ));
    }
    Ok(bytes)
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

    /// From the attack on TLS: a key file holding its PEM on one line (what
    /// `echo $KEY > client.key` writes) passed the load, and redis-rs's
    /// parser then put the whole key, as a byte array, in the connect
    /// error every command printed. The files are parsed here, and a file
    /// that does not parse gets a fixed message.
    #[cfg(feature = "tls")]
    #[test]
    fn a_one_line_key_is_refused_at_load_and_never_printed() {
        use rustls::pki_types::pem::PemObject;
        let dir = std::env::temp_dir().join(format!("flashsale-tls-flat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // A real key, generated by rustls' own types round trip is not
        // available: any base64 body shows the leak as well as a key.
        let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7S3cretKeyBytesAA";
        let flat = format!("-----BEGIN PRIVATE KEY----- {body} -----END PRIVATE KEY-----");
        let key = dir.join("flat.key");
        std::fs::write(&key, &flat).expect("write");
        assert!(
            rustls::pki_types::PrivateKeyDer::from_pem_slice(flat.as_bytes()).is_err(),
            "setup: the one-line key does not parse"
        );
        let ca = dir.join("ca.pem");
        std::fs::write(
            &ca,
            format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n"),
        )
        .expect("write");
        let files = TlsFiles {
            ca_file: None,
            cert_file: Some(ca.clone()),
            key_file: Some(key.clone()),
        };
        let e = Certificates::load(&files).expect_err("a key that does not parse");
        assert_eq!(e.field, "tls.key_file", "{e}");
        let text = format!("{e} {e:?}");
        assert!(!text.contains("cretKey"), "{text}");
        // Nor as the bytes of the key ("80, 82, 73, 86": "PRIV").
        assert!(!text.contains("80, 82, 73"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
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
        assert!(e.problem.contains("does not hold"), "{e}");
        assert!(!e.to_string().contains("S3cret"), "{e}");
        let missing = TlsFiles {
            ca_file: Some(dir.join("absent.pem")),
            ..TlsFiles::default()
        };
        let e = Certificates::load(&missing).unwrap_err();
        assert_eq!(e.field, "tls.ca_file");
        assert!(e.problem.contains("could not be read"), "{e}");
        // A directory, or a device, is refused before any read (a FIFO
        // hung the check; /dev/zero would have taken all memory).
        for odd in [dir.clone(), std::path::PathBuf::from("/dev/zero")] {
            let e = Certificates::load(&TlsFiles {
                ca_file: Some(odd),
                ..TlsFiles::default()
            })
            .unwrap_err();
            assert!(e.problem.contains("not a regular file"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
