//! The agent link's mutual TLS, for both ends: rustls configurations built
//! from PEM files (a certificate chain, its private key, and the CA the
//! peer's certificate must chain to) and rebuilt whenever the files'
//! content changes.
//!
//! The chart's cert-manager certificates last 90 days and are renewed in
//! place: kubelet swaps the mounted Secret's `..data` symlink to a folder
//! holding the new files. A configuration read once at start keeps the old
//! certificate, and once it expires every new connection fails its
//! handshake. So the caller asks [`Reloading::current`] for the
//! configuration at every handshake (one per new connection), and it
//! re-reads the three files and rebuilds only when their bytes differ from
//! the last read. Why at each handshake and not with a file watcher:
//! handshakes are rare, three small reads cost microseconds next to the
//! handshake's signatures, and a read cannot miss an event (inotify on the
//! file paths misses a symlink swap of their folder, and a watcher is a
//! task that can die); the next connection after a renewal always uses the
//! new files.
//!
//! No TLS session resumption, on either end: a resumed session skips the
//! check of the peer's certificate, so a client whose certificate expired
//! or was replaced (or a server's, seen from the client) would go on being
//! admitted on the strength of an earlier handshake. A full handshake per
//! connection costs nothing at the link's rate of new connections.
//!
//! ALPN is `h2` (gRPC) on both ends, the crypto provider rustls' ring, as
//! tonic's own TLS does.
use rustls::{
    client::{Resumption, WebPkiServerVerifier},
    crypto::CryptoProvider,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::{NoServerSessionStorage, WebPkiClientVerifier},
    ClientConfig, RootCertStore, ServerConfig,
};
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

/// A TLS file that could not be used, or a configuration rustls refused.
/// No variant carries a private key's bytes.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("TLS file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM object of the kind expected.
    #[error("TLS file {}: {why}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the file's content).
        why: String,
    },
    /// rustls refused the certificates and key together (the key does not
    /// match the certificate, the CA is not a usable trust anchor, ...).
    #[error("TLS configuration from {}: {source}", cert.display())]
    Config {
        /// The certificate file the configuration was built for.
        cert: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
}

/// The three PEM files of one end of the link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This end's certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA the other end's certificate must chain to.
    pub ca: PathBuf,
}

/// The parsed content of [`TlsFiles`].
struct Material {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
}

type Build<T> = fn(&TlsFiles, Material) -> Result<T, TlsError>;

/// A configuration built from [`TlsFiles`], rebuilt when their content
/// changes (see the module's documentation).
pub struct Reloading<T> {
    files: TlsFiles,
    build: Build<T>,
    state: Mutex<State<T>>,
}

struct State<T> {
    /// The bytes last read (built or not), so a bad change is reported once.
    seen: [Vec<u8>; 3],
    current: Arc<T>,
}

/// The configuration of the agent's gRPC server: its certificate, and
/// client certificates of the CA required.
pub type ServerTls = Reloading<ServerConfig>;
/// The configuration of a client of agents (the controller): its client
/// certificate, and agent certificates of the CA trusted.
pub type ClientTls = Reloading<ClientConfig>;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn config_error(files: &TlsFiles) -> impl FnOnce(rustls::Error) -> TlsError + '_ {
    |source| TlsError::Config {
        cert: files.cert.clone(),
        source,
    }
}

fn verifier_error(files: &TlsFiles, e: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: files.ca.clone(),
        why: format!("not a usable CA: {e}"),
    }
}

fn server_config(files: &TlsFiles, m: Material) -> Result<ServerConfig, TlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(m.roots, provider())
        .build()
        .map_err(|e| verifier_error(files, e))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_error(files))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(m.chain, m.key)
        .map_err(config_error(files))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

fn client_config(files: &TlsFiles, m: Material) -> Result<ClientConfig, TlsError> {
    let verifier = WebPkiServerVerifier::builder_with_provider(m.roots, provider())
        .build()
        .map_err(|e| verifier_error(files, e))?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_error(files))?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(m.chain, m.key)
        .map_err(config_error(files))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.resumption = Resumption::disabled();
    Ok(config)
}

fn read(files: &TlsFiles) -> Result<[Vec<u8>; 3], TlsError> {
    let one = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    Ok([one(&files.cert)?, one(&files.key)?, one(&files.ca)?])
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |why: String| TlsError::Pem {
        path: path.to_owned(),
        why,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("unreadable certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    Ok(certs)
}

fn parse(files: &TlsFiles, [cert, key, ca]: &[Vec<u8>; 3]) -> Result<Material, TlsError> {
    let chain = certificates(&files.cert, cert)?;
    // The parser's message could quote a line of the key file: not shown.
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| TlsError::Pem {
        path: files.key.clone(),
        why: "no readable PEM private key in the file".into(),
    })?;
    let mut roots = RootCertStore::empty();
    for anchor in certificates(&files.ca, ca)? {
        roots.add(anchor).map_err(|e| verifier_error(files, e))?;
    }
    Ok(Material {
        chain,
        key,
        roots: Arc::new(roots),
    })
}

impl ServerTls {
    /// Reads `files` and builds the server configuration; an unreadable or
    /// unusable file is an error naming it.
    pub fn server(files: TlsFiles) -> Result<Self, TlsError> {
        Reloading::open(files, server_config)
    }
}

impl ClientTls {
    /// Reads `files` and builds the client configuration; an unreadable or
    /// unusable file is an error naming it.
    pub fn client(files: TlsFiles) -> Result<Self, TlsError> {
        Reloading::open(files, client_config)
    }
}

impl<T> Reloading<T> {
    fn open(files: TlsFiles, build: Build<T>) -> Result<Self, TlsError> {
        let seen = read(&files)?;
        let current = Arc::new(build(&files, parse(&files, &seen)?)?);
        Ok(Reloading {
            files,
            build,
            state: Mutex::new(State { seen, current }),
        })
    }

    /// The files this configuration is built from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The configuration for a new handshake: re-reads the files and, when
    /// their bytes changed since the last read, rebuilds it. When the
    /// changed files cannot be used (a renewal half written, a key that
    /// does not match), the previous configuration stays in use and the
    /// error is returned beside it, once per change, for the caller to log.
    pub fn current(&self) -> (Arc<T>, Option<TlsError>) {
        let mut state = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let bytes = match read(&self.files) {
            Ok(b) => b,
            Err(e) => return (state.current.clone(), Some(e)),
        };
        if bytes == state.seen {
            return (state.current.clone(), None);
        }
        let built = parse(&self.files, &bytes).and_then(|m| (self.build)(&self.files, m));
        state.seen = bytes;
        match built {
            Ok(config) => {
                state.current = Arc::new(config);
                (state.current.clone(), None)
            }
            Err(e) => (state.current.clone(), Some(e)),
        }
    }
}
