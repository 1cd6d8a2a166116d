//! TLS to PostgreSQL, asked for the way every PostgreSQL client asks for
//! it: libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` in
//! `postgres_url`. tokio-postgres reads only `disable`, `prefer` and
//! `require`, and verifies nothing itself; this module takes the four
//! options out of the string before the driver reads it, and builds the
//! rustls connector (tokio-postgres-rustls) that does what the mode
//! promises. Why a module of its own: the pool, the redacted display and
//! `flashsale config check` must read the string the same way.
//!
//! One departure from libpq, on purpose: with no `sslmode` flashsale
//! connects in plain text, as it always has (libpq's default, `prefer`,
//! would encrypt without verifying anything, and only when the server
//! offers it). `sslmode=prefer` is accepted and means what it means in
//! libpq.

use std::path::PathBuf;

/// Why the TLS options of a `postgres_url` cannot be used: which option,
/// and why (never the string, which may hold a password, nor what a file
/// holds). `crate::db` gives it as `DbError::Tls`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PgTlsError(pub String);

/// libpq's `sslmode`, as flashsale honours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain text (also what no `sslmode` means here).
    #[default]
    Disable,
    /// TLS when the server offers it, without verifying the server.
    Prefer,
    /// TLS always; the server verified against `sslrootcert` only when it
    /// is given (libpq's rule).
    Require,
    /// TLS, the server's certificate chain verified against `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Result<SslMode, PgTlsError> {
        Ok(match v {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(PgTlsError(
                    "sslmode must be disable, prefer, require, verify-ca or verify-full".into(),
                ))
            }
        })
    }

    /// The mode as written, `None` for no TLS.
    fn written(self) -> Option<&'static str> {
        match self {
            SslMode::Disable => None,
            SslMode::Prefer => Some("prefer"),
            SslMode::Require => Some("require"),
            SslMode::VerifyCa => Some("verify-ca"),
            SslMode::VerifyFull => Some("verify-full"),
        }
    }

    /// What tokio-postgres is told: it only needs to know whether to ask
    /// the server for TLS and whether to go on without it.
    fn for_driver(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => "require",
        }
    }
}

/// Which certificates sign the server's (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of CA certificates.
    File(PathBuf),
    /// `sslrootcert=system`: the system's root certificates.
    System,
}

/// The TLS options of a `postgres_url`: what a connection will do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PgTls {
    /// The mode.
    pub mode: SslMode,
    /// `sslrootcert`.
    pub root_cert: Option<RootCert>,
    /// `sslcert`: this client's certificate (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// `sslkey`: its private key.
    pub key_file: Option<PathBuf>,
}

impl PgTls {
    /// Reads `url` (libpq key=value or URL form) into its parameters, once,
    /// here, and gives the string tokio-postgres is handed (every other
    /// parameter as key='value', quoted and escaped, after `sslmode` as
    /// the driver understands it) and what TLS will do. The driver never
    /// reads the user's text: two readers of one string disagreed three
    /// times (a `?` in a password, a last value left empty, an `@` after
    /// the host), and each time the mode asked for was lost; the driver
    /// reads a string with one reading only. Errors never carry the
    /// string, which may hold a password.
    pub fn split(url: &str) -> Result<(String, PgTls), PgTlsError> {
        // C readers of the string (libpq) stop at a NUL; other controls
        // are no part of any parameter. Refused, so nothing after one is
        // read here and not there.
        if url
            .chars()
            .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\u{c}'))
        {
            return Err(PgTlsError(
                "a control character (NUL, ...) in the connection string".into(),
            ));
        }
        let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
        let pairs = if is_url {
            url_pairs(url)?
        } else {
            key_value_pairs(url)?
        };
        let mut tls = PgTls::default();
        let mut kept = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            match key.as_str() {
                "sslmode" => tls.mode = SslMode::parse(&value)?,
                "sslrootcert" if value == "system" => tls.root_cert = Some(RootCert::System),
                "sslrootcert" => tls.root_cert = Some(RootCert::File(non_empty(&key, value)?)),
                "sslcert" => tls.cert_file = Some(non_empty(&key, value)?),
                "sslkey" => tls.key_file = Some(non_empty(&key, value)?),
                _ => kept.push((key, value)),
            }
        }
        tls.check()?;
        // libpq 17 refuses direct negotiation unless TLS is required: with
        // it the driver would speak plain text when told `disable`.
        let direct = kept
            .iter()
            .any(|(k, v)| k == "sslnegotiation" && v == "direct");
        if direct && matches!(tls.mode, SslMode::Disable | SslMode::Prefer) {
            return Err(PgTlsError(
                "sslnegotiation=direct needs sslmode=require, verify-ca or verify-full".into(),
            ));
        }
        Ok((canonical(tls.mode.for_driver(), &kept), tls))
    }

    /// The combinations libpq refuses, or that could only verify nothing
    /// while seeming to.
    fn check(&self) -> Result<(), PgTlsError> {
        let verifies = matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull);
        // libpq 16's rule: any public CA signs certificates for names that
        // are not this server's, so the system's roots prove something only
        // with the host name checked.
        if self.root_cert == Some(RootCert::System) && self.mode != SslMode::VerifyFull {
            return Err(PgTlsError(
                "sslrootcert=system needs sslmode=verify-full: against the public roots, a \
                 certificate proves something only for the host name it names"
                    .into(),
            ));
        }
        if verifies && self.root_cert.is_none() {
            return Err(PgTlsError(
                "sslmode=verify-ca and verify-full need sslrootcert: a PEM file of the CA \
                 certificates, or sslrootcert=system"
                    .into(),
            ));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => Err(PgTlsError("sslcert is set: sslkey is needed too".into())),
            (None, Some(_)) => Err(PgTlsError("sslkey is set: sslcert is needed too".into())),
            _ if self.mode == SslMode::Disable
                && (self.root_cert.is_some() || self.cert_file.is_some()) =>
            {
                Err(PgTlsError(
                    "sslrootcert, sslcert or sslkey given without an sslmode that uses TLS \
                     (require, verify-ca or verify-full)"
                        .into(),
                ))
            }
            _ => Ok(()),
        }
    }

    /// `sslmode` as written in the string, `None` when it asks for no TLS.
    pub fn mode_name(&self) -> Option<&'static str> {
        self.mode.written()
    }

    /// Whether the server's certificate chain is verified.
    pub fn verifies_chain(&self) -> bool {
        // libpq verifies the chain whenever it has a root certificate, in
        // `prefer` and `require` too.
        match self.mode {
            SslMode::Disable => false,
            SslMode::Prefer | SslMode::Require => self.root_cert.is_some(),
            SslMode::VerifyCa | SslMode::VerifyFull => true,
        }
    }

    /// What a connection will check, in words, for `flashsale config check`.
    pub fn describe(&self) -> String {
        let roots = match &self.root_cert {
            Some(RootCert::File(p)) => {
                format!("the CA certificates in {:?}", p.display().to_string())
            }
            Some(RootCert::System) | None => "the system's root certificates".to_owned(),
        };
        let client = match &self.cert_file {
            Some(c) => format!(
                "; presents the client certificate {:?}",
                c.display().to_string()
            ),
            None => String::new(),
        };
        let what = match self.mode {
            SslMode::Disable => return "PostgreSQL: plain text (no sslmode)".to_owned(),
            SslMode::Prefer if self.verifies_chain() => format!(
                "sslmode=prefer: TLS when the server offers it (plain text when it does not), \
                 its certificate chain verified against {roots} (not its host name)"
            ),
            SslMode::Prefer => {
                "sslmode=prefer: TLS when the server offers it, the server not verified".to_owned()
            }
            SslMode::Require if self.verifies_chain() => format!(
                "sslmode=require: TLS; verifies the server's certificate chain against {roots} \
                 (not its host name)"
            ),
            SslMode::Require => "sslmode=require: TLS, the server not verified".to_owned(),
            SslMode::VerifyCa => format!(
                "sslmode=verify-ca: TLS; verifies the server's certificate chain against \
                 {roots} (not its host name)"
            ),
            SslMode::VerifyFull => format!(
                "sslmode=verify-full: TLS; verifies the server's certificate and host name \
                 against {roots}"
            ),
        };
        format!("PostgreSQL: {what}{client}")
    }

    /// The connector for a TLS mode (`None` for `disable`), its files read
    /// now: an unreadable or wrong one fails here, naming the option and
    /// the path, never the contents.
    #[cfg(feature = "postgres-tls")]
    pub(crate) fn connector(
        &self,
    ) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, PgTlsError> {
        if self.mode == SslMode::Disable {
            return Ok(None);
        }
        verify::connector(self).map(Some)
    }
}

fn non_empty(key: &str, value: String) -> Result<PathBuf, PgTlsError> {
    if value.is_empty() {
        return Err(PgTlsError(format!("{key} must name a file")));
    }
    Ok(PathBuf::from(value))
}

/// A connection string's parameters, in order, as (name, value).
type Pairs = Vec<(String, String)>;

/// The driver's string: `sslmode` first, then every other parameter in
/// order as `key='value'` with `\` and `'` escaped, so the driver's reading
/// of it is the only one there is (repeated keys keep their order, and the
/// driver adds up hosts and ports as it would have).
fn canonical(mode: &str, pairs: &[(String, String)]) -> String {
    let mut out = format!("sslmode={mode}");
    // libpq keeps the last of a repeated key (a URL's query `host`
    // replaces the one before its path); the driver would add repeated
    // hosts and ports up and try the one the user overrode first.
    let last: Vec<&(String, String)> = pairs
        .iter()
        .enumerate()
        .filter(|(i, (k, _))| !pairs[i + 1..].iter().any(|(later, _)| later == k))
        .map(|(_, p)| p)
        .collect();
    for (key, value) in last {
        out.push(' ');
        out.push_str(key);
        out.push_str("='");
        for c in value.chars() {
            if c == '\\' || c == '\'' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('\'');
    }
    out
}

/// A parameter name as libpq spells them; anything else (a name the URL
/// decoded to something with a space or a quote) could not be written
/// back unambiguously, and the driver would refuse it anyway.
fn name(key: String) -> Result<String, PgTlsError> {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        Ok(key)
    } else {
        Err(PgTlsError(
            "a parameter name is not one of libpq's (lower-case letters, digits, '_')".into(),
        ))
    }
}

/// URL form, read where tokio-postgres's own `UrlParser` reads it: the
/// user info to the first `@`, the hosts (`host:port,...`, `[v6]:port`) to
/// the next `/` or `?`, the database to the next `?`; in the query a key
/// to the next `=` and a value to the next `&`; every part percent-decoded.
/// A URL the driver and libpq read differently is refused: libpq looks for
/// the user info's `@` before the first `/` only.
fn url_pairs(url: &str) -> Result<Pairs, PgTlsError> {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let mut rest = &url[scheme_end..];
    // The user info ends at the first '@' for the driver and for libpq;
    // one after a '/' or '?' is in the path or the query, and whoever wrote
    // it meant the query to be read: refused, with how to write it.
    if rest.matches('@').count() > 1 {
        return Err(PgTlsError(
            "more than one '@' in the URL: an '@' in the user name or password must be \
             written %40"
                .into(),
        ));
    }
    if let (Some(at), Some(end)) = (rest.find('@'), rest.find(['/', '?'])) {
        if at > end {
            return Err(PgTlsError(
                "an '@' after the host, or a '/' or '?' in the user name or password, \
                 must be percent-encoded (%40, %2F, %3F): read as written, the query \
                 would be taken for the user name and password"
                    .into(),
            ));
        }
    }
    let mut pairs = Pairs::new();
    if let Some(at) = rest.find('@') {
        let (user, password) = match rest[..at].split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (&rest[..at], None),
        };
        pairs.push(("user".into(), decode(user)?));
        if let Some(p) = password {
            pairs.push(("password".into(), decode(p)?));
        }
        rest = &rest[at + 1..];
    }
    let host_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let hosts = &rest[..host_end];
    rest = &rest[host_end..];
    if !hosts.is_empty() {
        // One host value and one port value, comma-separated, as libpq
        // keeps them: a query `host` or `port` later replaces them whole.
        let (mut host_list, mut port_list) = (Vec::new(), Vec::new());
        for chunk in hosts.split(',') {
            let (host, port) = if let Some(v6) = chunk.strip_prefix('[') {
                let (host, after) = v6.split_once(']').ok_or_else(bad_url)?;
                let port = match after {
                    "" => None,
                    a => Some(a.strip_prefix(':').ok_or_else(bad_url)?),
                };
                (host, port)
            } else {
                match chunk.split_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (chunk, None),
                }
            };
            host_list.push(decode(host)?);
            port_list.push(decode(port.unwrap_or("5432"))?);
        }
        pairs.push(("host".into(), host_list.join(",")));
        pairs.push(("port".into(), port_list.join(",")));
    }
    if let Some(path) = rest.strip_prefix('/') {
        let end = path.find('?').unwrap_or(path.len());
        if end > 0 {
            pairs.push(("dbname".into(), decode(&path[..end])?));
        }
        rest = &path[end..];
    }
    let mut query = rest.strip_prefix('?').unwrap_or(rest);
    while !query.is_empty() {
        let (key, after) = query.split_once('=').ok_or_else(bad_url)?;
        let (value, next) = after.split_once('&').unwrap_or((after, ""));
        pairs.push((name(decode(key)?)?, decode(value)?));
        query = next;
    }
    Ok(pairs)
}

fn bad_url() -> PgTlsError {
    PgTlsError("the connection string does not parse".into())
}

/// Percent-decoded, as the driver decodes; a part that is not UTF-8 once
/// decoded is refused (the driver reads the string back as text).
fn decode(s: &str) -> Result<String, PgTlsError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| PgTlsError("a part of the URL is not UTF-8 once percent-decoded".into()))
}

/// Key=value form, read as tokio-postgres reads it (`key = value`, a value
/// bare with `\` escapes or in single quotes; an empty last value refused,
/// as the driver refuses it).
fn key_value_pairs(s: &str) -> Result<Pairs, PgTlsError> {
    let bad = || PgTlsError("the connection string does not parse".into());
    // libpq separates at ASCII white space only, the driver at any: a
    // non-ASCII space outside quotes would be read two ways, refused.
    let unicode_space = || {
        PgTlsError(
            "a non-ASCII space (U+00A0, U+3000, ...) outside quotes: libpq reads it as \
             part of the value, the driver as a separator; quote the value"
                .into(),
        )
    };
    let is_space = |c: char| -> Result<bool, PgTlsError> {
        match c {
            c if c.is_ascii_whitespace() => Ok(true),
            c if c.is_whitespace() => Err(unicode_space()),
            _ => Ok(false),
        }
    };
    let mut pairs = Pairs::new();
    let mut it = s.char_indices().peekable();
    loop {
        while let Some(&(_, c)) = it.peek() {
            if !is_space(c)? {
                break;
            }
            it.next();
        }
        let Some(&(start, _)) = it.peek() else { break };
        let mut key_end = s.len();
        while let Some(&(i, c)) = it.peek() {
            if is_space(c)? || c == '=' {
                key_end = i;
                break;
            }
            it.next();
        }
        let key = &s[start..key_end];
        while let Some(&(_, c)) = it.peek() {
            if !is_space(c)? {
                break;
            }
            it.next();
        }
        if it.next().map(|(_, c)| c) != Some('=') || key.is_empty() {
            return Err(bad());
        }
        while let Some(&(_, c)) = it.peek() {
            if !is_space(c)? {
                break;
            }
            it.next();
        }
        let mut value = String::new();
        if it.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match it.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => value.push(it.next().ok_or_else(bad)?.1),
                    Some((_, c)) => value.push(c),
                    None => return Err(bad()),
                }
            }
        } else {
            while let Some(&(_, c)) = it.peek() {
                if is_space(c)? {
                    break;
                }
                it.next();
                if c == '\\' {
                    if let Some((_, e)) = it.next() {
                        value.push(e);
                    }
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(bad());
            }
        }
        pairs.push((name(key.to_owned())?, value));
    }
    Ok(pairs)
}

/// The rustls side: the verifiers each mode needs and the files read.
#[cfg(feature = "postgres-tls")]
mod verify {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

    use super::{PgTls, PgTlsError, RootCert, SslMode};

    pub(super) fn connector(
        tls: &PgTls,
    ) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgTlsError> {
        crate::tls::install_crypto_provider();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| PgTlsError(format!("TLS versions: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> = if tls.verifies_chain() {
            let roots = Arc::new(roots(tls.root_cert.as_ref())?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| PgTlsError(format!("sslrootcert: {e}")))?;
            if tls.mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        } else {
            Arc::new(Unverified(provider))
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&tls.cert_file, &tls.key_file) {
            (Some(cert), Some(key)) => {
                let chain = read("sslcert", cert, |b| {
                    CertificateDer::pem_slice_iter(b)
                        .collect::<Result<Vec<_>, _>>()
                        .ok()
                        .filter(|c| !c.is_empty())
                        .map(|c| c.into_iter().map(|c| c.into_owned()).collect::<Vec<_>>())
                })?;
                let key = read("sslkey", key, |b| {
                    PrivateKeyDer::from_pem_slice(b).ok().map(|k| k.clone_key())
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|_| PgTlsError("sslkey is not the key of sslcert".into()))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }

    /// The trusted roots: a file's certificates, or the system's.
    fn roots(root: Option<&RootCert>) -> Result<RootCertStore, PgTlsError> {
        let mut store = RootCertStore::empty();
        match root {
            Some(RootCert::File(path)) => {
                let certs = read("sslrootcert", path, |b| {
                    CertificateDer::pem_slice_iter(b)
                        .collect::<Result<Vec<_>, _>>()
                        .ok()
                        .filter(|c| !c.is_empty())
                        .map(|c| c.into_iter().map(|c| c.into_owned()).collect::<Vec<_>>())
                })?;
                for c in certs {
                    store
                        .add(c)
                        .map_err(|_| PgTlsError("sslrootcert holds an unusable CA".into()))?;
                }
            }
            Some(RootCert::System) | None => {
                let found = rustls_native_certs::load_native_certs();
                store.add_parsable_certificates(found.certs);
                if store.is_empty() {
                    return Err(PgTlsError(
                        "sslrootcert=system: no system root certificate could be read".into(),
                    ));
                }
            }
        }
        Ok(store)
    }

    /// A file read and parsed by `parse`; the error names the option and
    /// the path, never what the file holds (`crate::tls` reads the
    /// `[tls]` files the same way, and says why).
    fn read<T>(
        option: &str,
        path: &std::path::Path,
        parse: impl Fn(&[u8]) -> Option<T>,
    ) -> Result<T, PgTlsError> {
        let shown = format!("{:?}", path.display().to_string());
        let meta = std::fs::metadata(path)
            .map_err(|e| PgTlsError(format!("{option} {shown} could not be read: {}", e.kind())))?;
        if !meta.is_file() || meta.len() > 1 << 20 {
            return Err(PgTlsError(format!(
                "{option} {shown} is not a regular file of at most 1 MiB"
            )));
        }
        let bytes = crate::tls::read_bounded(path).map_err(|e| match e {
            Some(kind) => PgTlsError(format!("{option} {shown} could not be read: {kind}")),
            None => PgTlsError(format!(
                "{option} {shown} is not a regular file of at most 1 MiB"
            )),
        })?;
        parse(&bytes).ok_or_else(|| {
            PgTlsError(format!(
                "{option} {shown} does not hold what it should (PEM certificates for \
                 sslrootcert and sslcert, an unencrypted PEM private key for sslkey)"
            ))
        })
    }

    /// `verify-ca` (and `require` with `sslrootcert`): the chain must lead
    /// to a trusted root; the host name is not checked.
    #[derive(Debug)]
    struct ChainOnly(Arc<WebPkiServerVerifier>);

    impl ServerCertVerifier for ChainOnly {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            match self
                .0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                Err(Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }

    /// `require` and `prefer` without `sslrootcert`: libpq encrypts and
    /// verifies nothing. The handshake's signatures are still checked, so
    /// the server holds the key of the certificate it shows.
    #[derive(Debug)]
    struct Unverified(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for Unverified {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_full_is_taken_out_of_a_key_value_string_and_told_as_require() {
        let (rest, tls) = PgTls::split(
            "host=db.internal port=5433 user=fs password='a b\\'c' sslmode=verify-full \
             sslrootcert='/etc/ca dir/root.crt' dbname=orders",
        )
        .expect("split");
        assert_eq!(
            rest,
            "sslmode=require host='db.internal' port='5433' user='fs' password='a b\\'c' \
             dbname='orders'"
        );
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(
            tls.root_cert,
            Some(RootCert::File("/etc/ca dir/root.crt".into()))
        );
        let pg: tokio_postgres::Config = rest.parse().expect("the driver reads what is left");
        assert_eq!(pg.get_password(), Some(&b"a b'c"[..]));
    }

    #[test]
    fn verify_ca_is_taken_out_of_a_url_with_its_other_parameters_kept() {
        let (rest, tls) = PgTls::split(
            "postgres://fs:pw@db:5432/orders?application_name=fs&sslmode=verify-ca\
             &sslrootcert=%2Fetc%2Fca.crt&connect_timeout=3",
        )
        .expect("split");
        assert_eq!(
            rest,
            "sslmode=require user='fs' password='pw' host='db' port='5432' dbname='orders' \
             application_name='fs' connect_timeout='3'"
        );
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(tls.root_cert, Some(RootCert::File("/etc/ca.crt".into())));
        rest.parse::<tokio_postgres::Config>()
            .expect("the driver reads what is left");
        let (rest, tls) = PgTls::split("postgresql://db/orders").expect("split");
        assert_eq!(
            rest,
            "sslmode=disable host='db' port='5432' dbname='orders'"
        );
        assert_eq!(tls, PgTls::default());
    }

    #[test]
    fn verify_full_without_a_root_certificate_is_refused_without_the_password() {
        for url in [
            "host=db user=fs password=S3cret sslmode=verify-full",
            "postgres://fs:S3cret@db/orders?sslmode=verify-ca",
        ] {
            let e = PgTls::split(url).expect_err("no sslrootcert");
            assert!(e.to_string().contains("sslrootcert"), "{e}");
            assert!(!e.to_string().contains("S3cret"), "{e}");
        }
        let e = PgTls::split("host=db sslmode=verify-everything").expect_err("bad mode");
        assert!(e.to_string().contains("sslmode must be"), "{e}");
        let e = PgTls::split("host=db sslmode=require sslcert=/c.crt").expect_err("no key");
        assert!(e.to_string().contains("sslkey"), "{e}");
        let e = PgTls::split("host=db sslrootcert=/ca.crt").expect_err("no mode");
        assert!(e.to_string().contains("without an sslmode"), "{e}");
        assert!(PgTls::split("host=db password='unterminated").is_err());
    }

    #[test]
    fn require_verifies_the_chain_only_when_given_a_root_certificate() {
        let (_, plain) = PgTls::split("host=db sslmode=require").expect("split");
        assert!(!plain.verifies_chain());
        assert!(plain.describe().contains("not verified"));
        let (_, rooted) =
            PgTls::split("host=db sslmode=require sslrootcert=/ca.crt").expect("split");
        assert!(rooted.verifies_chain());
        assert!(rooted.describe().contains("not its host name"));
        let (_, full) =
            PgTls::split("host=db sslmode=verify-full sslrootcert=system").expect("split");
        assert_eq!(full.root_cert, Some(RootCert::System));
        assert!(full.describe().contains("host name against the system's"));
    }

    /// From the first attack: a `?` in a URL's password was taken for the
    /// query's start and `sslmode=require` went plain text. From the third:
    /// an `@` after a `?` (no `/` before it) made the whole query the user
    /// name, and the mode asked for was lost (libpq reads it so too). A
    /// `/`, `?` or `@` in the user info must be percent-encoded: such a URL
    /// is refused, never read without its mode.
    #[test]
    fn a_question_mark_in_a_url_password_never_turns_tls_off() {
        for url in [
            "postgresql://postgres:Ab?cd=ef&gh@127.0.0.1:7401/flashsale?sslmode=require",
            "postgres://u:S3&cret?a=b@127.0.0.1/db?sslmode=require",
            "postgresql://localhost?port=7710&password=S3cretPW&sslmode=require&dbname=f&application_name=fs@localhost:7710",
            "postgres://localhost?sslmode=verify-full&sslrootcert=system&user=postgres&application_name=fs@localhost",
        ] {
            let e = PgTls::split(url).expect_err(url);
            assert!(e.0.contains("%40") && e.0.contains("%3F"), "{e}");
            assert!(!e.0.contains("S3cret"), "{e}");
        }
        // Encoded, the same password is read, and the mode with it.
        let (rest, tls) = PgTls::split(
            "postgresql://postgres:Ab%3Fcd%3Def%26gh@127.0.0.1:7401/flashsale?sslmode=require",
        )
        .expect("split");
        assert_eq!(tls.mode, SslMode::Require);
        let pg: tokio_postgres::Config = rest.parse().expect("the driver reads it");
        assert_eq!(pg.get_password(), Some(&b"Ab?cd=ef&gh"[..]));
        assert_eq!(pg.get_dbname(), Some("flashsale"));
    }

    /// From the third attack: libpq ends a bare value at ASCII white space
    /// only; tokio-postgres (and this reader, which followed it) at any
    /// Unicode space. `application_name=fs\u{a0}sslmode=disable` was one
    /// value to libpq, over TLS, and plain text here. A non-ASCII space
    /// outside quotes is refused.
    #[test]
    fn a_unicode_space_outside_quotes_is_refused_not_read_as_a_separator() {
        for url in [
            "host=localhost sslmode=require application_name=fs\u{a0}sslmode=disable",
            "host=localhost sslmode=verify-full sslrootcert=/ca.pem application_name=fs\u{3000}sslmode=prefer",
        ] {
            let e = PgTls::split(url).expect_err(url);
            assert!(e.0.contains("space"), "{e}");
        }
        // Quoted, it is part of the value.
        let (_, tls) = PgTls::split("host=localhost sslmode=require application_name='fs\u{a0}x'")
            .expect("quoted");
        assert_eq!(tls.mode, SslMode::Require);
    }

    /// From the third attack: `sslnegotiation=direct` with no TLS mode
    /// connected in plain text where libpq 17 refuses it.
    #[test]
    fn direct_negotiation_needs_a_mode_that_requires_tls() {
        for mode in ["", "sslmode=disable", "sslmode=prefer"] {
            let url = format!("host=db sslnegotiation=direct {mode}");
            let e = PgTls::split(&url).expect_err(&url);
            assert!(e.0.contains("sslnegotiation"), "{e}");
        }
        PgTls::split("host=db sslnegotiation=direct sslmode=require").expect("with require");
    }

    /// From the attack: `sslmode=require` appended to a key=value string
    /// whose last value was empty (`application_name=`) or ended in `\`
    /// became that value, and the driver fell back to its default,
    /// `prefer`: plain text to a server that declines TLS, under
    /// `verify-full`.
    #[test]
    fn an_empty_or_escaped_last_value_never_swallows_the_mode() {
        for url in [
            "host=127.0.0.1 sslmode=verify-full sslrootcert=/ca.pem application_name=",
            "host=127.0.0.1 sslmode=verify-full sslrootcert=/ca.pem application_name=fs\\",
        ] {
            match PgTls::split(url) {
                // An empty last value is refused, as the driver refuses it.
                Err(e) => assert!(url.ends_with('='), "{url}: {e}"),
                Ok((rest, tls)) => {
                    assert_eq!(tls.mode, SslMode::VerifyFull);
                    let pg: tokio_postgres::Config = rest.parse().expect("the driver reads it");
                    assert_eq!(
                        pg.get_ssl_mode(),
                        tokio_postgres::config::SslMode::Require,
                        "{url} -> {rest}"
                    );
                }
            }
        }
    }

    /// From the attack: libpq (16) takes `sslrootcert=system` only with
    /// `verify-full`: any public CA signs certificates for names that are
    /// not this server's, so the chain alone proves nothing.
    #[test]
    fn system_roots_are_refused_without_verify_full() {
        for mode in ["require", "verify-ca", "prefer"] {
            let e = PgTls::split(&format!("host=db sslmode={mode} sslrootcert=system"))
                .expect_err(mode);
            assert!(e.0.contains("verify-full"), "{mode}: {e}");
        }
    }

    /// From the attack: the 1 MiB bound was a `stat`, and a `/proc` file
    /// says 0 bytes and does not end (pagemap ran a check out of memory).
    /// The bound is on the read now.
    #[cfg(feature = "postgres-tls")]
    #[test]
    fn a_file_that_never_ends_is_refused_at_the_bound() {
        let (_, tls) = PgTls::split("host=db sslmode=verify-full sslrootcert=/proc/self/pagemap")
            .expect("split");
        // Refused at the bound, or by the kernel (pagemap takes reads of
        // whole 8-byte entries only); either way without reading it whole.
        let e = tls.connector().err().expect("refused");
        assert!(
            e.0.contains("at most 1 MiB") || e.0.contains("could not be read"),
            "{e}"
        );
        let files = crate::TlsFiles {
            ca_file: Some("/proc/self/pagemap".into()),
            ..crate::TlsFiles::default()
        };
        let e = crate::Certificates::load(&files).expect_err("refused");
        assert!(
            e.problem.contains("larger than") || e.problem.contains("could not be read"),
            "{e}"
        );
    }

    /// From the second attack: libpq ends a URL's user info before the
    /// first `/`; tokio-postgres at the first `@` anywhere. An unescaped
    /// `@` after the host (in `application_name`, a password given in the
    /// query, a path) made the whole query a "password" here, the mode
    /// asked for was lost, and plain text went to a server libpq reached
    /// over TLS. Such a URL is refused.
    #[test]
    fn an_unescaped_at_sign_after_the_host_is_refused_not_read_as_user_info() {
        for url in [
            "postgresql://127.0.0.1:7500/flashsale?user=postgres&password=Secr3t&sslmode=verify-full&sslrootcert=/ca.pem&application_name=fs@127.0.0.1:7500",
            "postgres://127.0.0.1:7500/flashsale?user=postgres&password=p@ssw0rd&sslmode=verify-full&sslrootcert=/ca.pem",
            "postgres://db/orders@x",
            "postgres://127.0.0.1/db?application_name=a@b&sslmode=require",
        ] {
            let e = PgTls::split(url).expect_err(url);
            assert!(e.0.contains("%40"), "{e}");
            assert!(!e.0.contains("ssw0rd") && !e.0.contains("Secr3t"), "{e}");
        }
        // An '@' before the host, and an encoded one after it, are fine.
        PgTls::split("postgres://u:p@db/orders?application_name=fs%40x&sslmode=require")
            .expect("user info before the host");
    }

    /// The driver's reading of what it is handed equals its own reading of
    /// the user's string, whatever the quoting, where the two have no
    /// repeated key (there libpq's last-one-wins is kept, not the
    /// driver's adding up: `a_repeated_host_or_port_replaces_...`).
    #[test]
    fn the_driver_reads_what_we_read() {
        for url in [
            "host=h1,h2 port=5432,5433 user=u password='a b\\'c\\\\' dbname=d application_name=x\\ y",
            "host = h  user=u password=p=q dbname='' options='-c x=y'",
            "postgres://u:p%40ss%3Aw@h1:5432,[::1]:5433/d%20b?application_name=a%26b&connect_timeout=3",
            "postgresql://u:Ab%3Fcd=ef&gh@127.0.0.1:7401/flashsale",
            "postgresql://%2Fvar%2Frun%2Fpostgresql/db",
        ] {
            let (rest, _) = PgTls::split(url).expect(url);
            let ours: tokio_postgres::Config = rest.parse().expect(url);
            let theirs: tokio_postgres::Config = url.parse().expect(url);
            assert_eq!(ours.get_hosts(), theirs.get_hosts(), "{url}");
            assert_eq!(ours.get_ports(), theirs.get_ports(), "{url}");
            assert_eq!(ours.get_user(), theirs.get_user(), "{url}");
            assert_eq!(ours.get_password(), theirs.get_password(), "{url}");
            assert_eq!(ours.get_dbname(), theirs.get_dbname(), "{url}");
            assert_eq!(ours.get_options(), theirs.get_options(), "{url}");
            assert_eq!(
                ours.get_application_name(),
                theirs.get_application_name(),
                "{url}"
            );
        }
    }

    /// From the fourth attack: an apostrophe inside a bare value flipped a
    /// separate scan's idea of "quoted", the non-ASCII space after it went
    /// through, and a second `sslmode` won (plain text; verify-full read
    /// as require). The reader itself now refuses such a space.
    #[test]
    fn an_apostrophe_in_a_bare_value_does_not_hide_a_unicode_space() {
        for url in [
            "host=127.0.0.1 sslmode=require application_name=fs'x\u{a0}sslmode=disable",
            "host=h sslmode=verify-full sslrootcert=/ca.crt application_name=fs'x\u{3000}sslmode=require",
        ] {
            let e = PgTls::split(url).expect_err(url);
            assert!(e.0.contains("space"), "{e}");
        }
    }

    /// From the fourth attack: libpq keeps the last of a repeated key (a
    /// URL's query `host` replaces the one before the path); the driver
    /// adds repeated hosts and ports up, and connected first to the host
    /// the user had overridden.
    #[test]
    fn a_repeated_host_or_port_replaces_the_earlier_one_as_in_libpq() {
        for url in [
            "postgres://127.0.0.1:7899/flashsale?host=127.0.0.1&port=7810&sslmode=require",
            "host=127.0.0.1 port=7899 dbname=flashsale sslmode=require host=127.0.0.1 port=7810",
        ] {
            let (rest, _) = PgTls::split(url).expect(url);
            let pg: tokio_postgres::Config = rest.parse().expect(url);
            assert_eq!(pg.get_ports(), &[7810], "{url} -> {rest}");
            assert_eq!(pg.get_hosts().len(), 1, "{url} -> {rest}");
        }
        // Several hosts in one value stay several, as in libpq.
        let (rest, _) = PgTls::split("postgres://h1:5432,h2:5433/d").expect("two hosts");
        let pg: tokio_postgres::Config = rest.parse().expect("parse");
        assert_eq!(pg.get_ports(), &[5432, 5433]);
    }

    /// From the fourth attack: a second unescaped `@` (a password with `@`
    /// and `/`) put the password's tail in the host and database, shown by
    /// config check and sent to the server; a NUL, where C readers of the
    /// string stop, let a later `sslmode=disable` be read here.
    #[test]
    fn a_second_at_sign_or_a_control_character_is_refused() {
        for url in [
            "postgres://fs:Pa@ssW0rd/Secr3t@db.internal/orders?sslmode=require",
            "postgres://fs:Pa@ssW0rd,Secr3t@db.internal/orders?sslmode=require",
            "postgres://postgres:Pa@127.0.0.1:7810/Secr3t@db.internal?sslmode=require",
            "host=127.0.0.1 sslmode=require password=pw\u{0} sslmode=disable",
            "postgres://u@h/db?sslmode=require&application_name=a\u{0}",
        ] {
            let e = PgTls::split(url).expect_err(url);
            assert!(!e.0.contains("Secr3t") && !e.0.contains("ssW0rd"), "{e}");
        }
    }
}
