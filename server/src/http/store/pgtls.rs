//! TLS to PostgreSQL, as libpq's URL parameters ask for it (rustls, ring):
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it | not checked, unless `sslrootcert` is given (then as `verify-ca`) |
//! | `require` | always | as `prefer` |
//! | `verify-ca` | always | signed by a root of `sslrootcert` (default `~/.postgresql/root.crt`) |
//! | `verify-full` | always | as `verify-ca`, and issued for the host connected to |
//!
//! `sslrootcert=system` takes the machine's trusted roots and, as in libpq, only with
//! `verify-full` (the default it sets). `sslcert` and `sslkey` (PEM files) give a client
//! certificate. `sslmode=allow` and the parameters tokio-postgres does not know are refused by
//! name. An unchecked certificate (`prefer`, `require`) still has its handshake signatures
//! checked: the channel is encrypted to whoever holds the certificate's key, as in libpq.
//!
//! tokio-postgres itself knows only `disable`, `prefer` and `require`: [`split`] takes the rest
//! out of the URL and gives the connector that does what they ask.

use super::types::StoreError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Result<Mode, String> {
        Ok(match value {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            "allow" => {
                return Err("sslmode=allow (plain text first, TLS only when the server \
                            insists) is not supported: use disable, prefer, require, verify-ca or \
                            verify-full"
                    .to_string())
            }
            other => {
                return Err(format!(
                    "sslmode={other} is not a libpq sslmode: use disable, prefer, require, \
                     verify-ca or verify-full"
                ))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }
}

/// A URL for tokio-postgres and the TLS connector its `sslmode` needs.
pub struct Split {
    /// The URL with the TLS parameters tokio-postgres does not read taken out, and `sslmode`
    /// given as one it reads (`require` for the `verify-*` modes).
    pub url: String,
    pub tls: MakeRustlsConnect,
}

/// Reads the TLS parameters of `url` (a `postgres://` URL, its scheme in lower case).
pub fn split(url: &str) -> Result<Split, StoreError> {
    split_in(url, std::env::var_os("HOME").map(PathBuf::from).as_deref())
}

/// [`split`], with libpq's default root certificates under `home`.
fn split_in(url: &str, home: Option<&std::path::Path>) -> Result<Split, StoreError> {
    let config = |m: String| StoreError::Config(m);
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut kept = Vec::new();
    let mut mode = None;
    let mut root = None;
    let mut cert = None;
    let mut key = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let value = || {
            percent_encoding::percent_decode_str(v)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| config(format!("the URL's {k} is not UTF-8 once decoded")))
        };
        match k {
            "sslmode" => mode = Some(Mode::parse(&value()?).map_err(config)?),
            "sslrootcert" => root = Some(value()?),
            "sslcert" => cert = Some(PathBuf::from(value()?)),
            "sslkey" => key = Some(PathBuf::from(value()?)),
            "sslpassword"
            | "sslcrl"
            | "sslcrldir"
            | "sslsni"
            | "ssl_min_protocol_version"
            | "ssl_max_protocol_version"
            | "sslcertmode"
            | "sslcompression"
            | "requiressl" => {
                return Err(config(format!(
                    "the URL's {k} is not supported (remat reads sslmode, sslrootcert, sslcert \
                     and sslkey)"
                )))
            }
            _ => kept.push(pair),
        }
    }
    let system = root.as_deref() == Some("system");
    let mode = match mode {
        Some(m) => m,
        None if system => Mode::VerifyFull,
        None => Mode::Prefer,
    };
    if system && mode != Mode::VerifyFull {
        return Err(config(format!(
            "sslrootcert=system trusts every certificate authority of this machine, so it needs \
             sslmode=verify-full (not {}), as in libpq",
            mode.name()
        )));
    }
    let verify = match mode {
        Mode::Disable | Mode::Prefer | Mode::Require => root.is_some().then_some(Mode::VerifyCa),
        m => Some(m),
    };
    // ring, whose provider rustls 0.23.48 deprecated for lacking post-quantum key exchange:
    // aws-lc-rs would add a second C library build (cmake, minutes on 2 cores) to every fresh
    // machine for a database connection's key exchange; revisit when rustls drops ring.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| config(format!("TLS: {e}")))?;
    let builder = match verify {
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(Arc::clone(&provider)))),
        Some(m) => {
            let roots = roots(root.as_deref(), m, home)?;
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| config(format!("TLS roots: {e}")))?;
            if m == Mode::VerifyFull {
                builder.with_webpki_verifier(webpki)
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
            }
        }
    };
    let client = match (cert, key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = read_certs(&cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| {
                config(format!(
                    "sslkey {}: no private key read from it ({e})",
                    key.display()
                ))
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                config(format!(
                    "sslcert and sslkey: not a certificate and its key ({e})"
                ))
            })?
        }
        (Some(_), None) => return Err(config("sslcert without sslkey: give both".to_string())),
        (None, Some(_)) => return Err(config("sslkey without sslcert: give both".to_string())),
    };
    kept.push(match mode {
        Mode::Disable => "sslmode=disable",
        Mode::Prefer => "sslmode=prefer",
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => "sslmode=require",
    });
    Ok(Split {
        url: format!("{base}?{}", kept.join("&")),
        tls: MakeRustlsConnect::new(client),
    })
}

fn read_certs(
    path: &std::path::Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StoreError::Config(format!("{what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(StoreError::Config(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// The roots a `verify-*` mode checks against: `sslrootcert`'s file, the machine's roots for
/// `system`, or libpq's default file.
fn roots(
    given: Option<&str>,
    mode: Mode,
    home: Option<&std::path::Path>,
) -> Result<RootCertStore, StoreError> {
    let mut store = RootCertStore::empty();
    if given == Some("system") {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(StoreError::Config(format!(
                "sslrootcert=system: no trusted root certificate found on this machine{}",
                found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )));
        }
        return Ok(store);
    }
    let path = match given {
        Some(p) => PathBuf::from(p),
        None => {
            let default = home
                .map(|h| h.join(".postgresql/root.crt"))
                .unwrap_or_else(|| PathBuf::from("~/.postgresql/root.crt"));
            if !default.exists() {
                return Err(StoreError::Config(format!(
                    "sslmode={} checks the server's certificate against root certificates: give \
                     them as sslrootcert=<PEM file> (or sslrootcert=system for this machine's), \
                     or put them in {} as libpq does",
                    mode.name(),
                    default.display()
                )));
            }
            default
        }
    };
    for cert in read_certs(&path, "sslrootcert")? {
        store.add(cert).map_err(|e| {
            StoreError::Config(format!(
                "sslrootcert {}: a certificate in it is not a usable root ({e})",
                path.display()
            ))
        })?;
    }
    Ok(store)
}

/// `verify-ca`: the chain must lead to a root, whatever name the certificate is for.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without roots: any certificate, its handshake signatures checked.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match split(url) {
            Ok(_) => panic!("{url} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn modes_tokio_postgres_does_not_read_are_given_as_require() {
        let s = split("postgres://u@h/db?application_name=x&sslmode=require").unwrap();
        assert_eq!(
            s.url,
            "postgres://u@h/db?application_name=x&sslmode=require"
        );
        let s = split("postgres://u@h/db").unwrap();
        assert_eq!(s.url, "postgres://u@h/db?sslmode=prefer");
        assert_eq!(
            split("postgres://u@h/db?sslmode=disable").unwrap().url,
            "postgres://u@h/db?sslmode=disable"
        );
    }

    #[test]
    fn what_is_not_supported_is_named() {
        assert!(err("postgres://h/db?sslmode=allow").contains("sslmode=allow"));
        assert!(err("postgres://h/db?sslmode=verify").contains("sslmode=verify is not"));
        assert!(err("postgres://h/db?sslcrl=/x").contains("sslcrl is not supported"));
        assert!(err("postgres://h/db?sslrootcert=system&sslmode=require")
            .contains("needs sslmode=verify-full (not require)"));
        assert!(err("postgres://h/db?sslcert=/a.pem").contains("sslcert without sslkey"));
        let missing = err("postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent/root.crt");
        assert!(
            missing.contains("sslrootcert /nonexistent/root.crt"),
            "{missing}"
        );
    }

    #[test]
    fn verify_modes_without_roots_say_where_to_put_them() {
        let home = tempfile::tempdir().unwrap();
        let e = match split_in("postgres://h/db?sslmode=verify-full", Some(home.path())) {
            Ok(_) => panic!("verify-full without roots was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("sslrootcert=<PEM file>"), "{e}");
        assert!(e.contains(".postgresql/root.crt"), "{e}");
    }
}
