//! The keys of recovery: the operator's trust anchor (public keys that may
//! sign grants) and the agent's server TLS identity (which signs snapshots).
//!
//! PEM is read with `rustls-pki-types`, names and public-key algorithms with
//! `x509-parser`, and the signature math is ring's: the crypto provider the
//! agent's rustls already uses, so recovery adds no second implementation of
//! ECDSA or RSA. Signatures are over SHA-256 of the message: ECDSA as ASN.1
//! DER, RSA as PKCS#1 v1.5, which is what Go's `crypto.Signer.Sign(rand,
//! sha256(m), crypto.SHA256)` produces.
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use rustls_pki_types::{
    pem::{PemObject, SectionKind},
    PrivateKeyDer,
};
use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
use x509_parser::x509::SubjectPublicKeyInfo;

const RSA: &str = "1.2.840.113549.1.1.1";
const EC: &str = "1.2.840.10045.2.1";
const P256: &str = "1.2.840.10045.3.1.7";
const P384: &str = "1.3.132.0.34";

/// Why recovery cannot be configured; the agent does not start.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file cannot be read.
    #[error("recovery trust anchor {path}: cannot read it: {why}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The cause.
        why: String,
    },
    /// A block cannot be decoded.
    #[error("recovery trust anchor {path}: block {block} cannot be parsed: {why}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based block number.
        block: usize,
        /// The cause.
        why: String,
    },
    /// A key of another algorithm.
    #[error("recovery trust anchor {path}: block {block} holds a key of {algorithm}; only RSA and ECDSA (P-256, P-384) keys may sign grants")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// 1-based block number.
        block: usize,
        /// What it holds.
        algorithm: String,
    },
    /// No key at all.
    #[error("recovery trust anchor {path}: no PUBLIC KEY or CERTIFICATE block with a usable key")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The server certificate cannot name the agent.
    #[error("recovery: the server certificate {path} has no Subject CN and no DNS SAN; snapshots could not name this agent")]
    Nameless {
        /// The certificate file.
        path: PathBuf,
    },
    /// The server identity cannot sign snapshots.
    #[error("recovery: the server TLS identity ({path}) cannot sign snapshots: {why}")]
    ServerIdentity {
        /// The certificate or key file.
        path: PathBuf,
        /// The cause.
        why: String,
    },
}

/// A public key that verifies SHA-256 signatures.
#[derive(Clone)]
pub struct PublicKey {
    algorithm: &'static dyn VerificationAlgorithm,
    /// The subjectPublicKey bits (RSAPublicKey DER or an EC point).
    key: Vec<u8>,
    /// "ECDSA P-256", "RSA", ... for messages.
    kind: &'static str,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} public key", self.kind)
    }
}

impl PublicKey {
    /// The key of a DER SubjectPublicKeyInfo; `Err` names the algorithm it holds.
    pub fn from_spki(der: &[u8]) -> Result<Self, String> {
        let (_, spki) =
            SubjectPublicKeyInfo::from_der(der).map_err(|e| format!("not a public key: {e}"))?;
        Self::from_parsed(&spki)
    }

    /// The key of a DER certificate.
    pub fn from_certificate(der: &[u8]) -> Result<Self, String> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| format!("not a certificate: {e}"))?;
        Self::from_parsed(cert.public_key())
    }

    fn from_parsed(spki: &SubjectPublicKeyInfo<'_>) -> Result<Self, String> {
        let alg = spki.algorithm.algorithm.to_id_string();
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|o| o.to_id_string());
        let (algorithm, kind): (&'static dyn VerificationAlgorithm, _) =
            match (alg.as_str(), curve.as_deref()) {
                (RSA, _) => (&signature::RSA_PKCS1_2048_8192_SHA256, "RSA"),
                (EC, Some(P256)) => (&signature::ECDSA_P256_SHA256_ASN1, "ECDSA P-256"),
                (EC, Some(P384)) => (&signature::ECDSA_P384_SHA256_ASN1, "ECDSA P-384"),
                (EC, other) => {
                    return Err(format!("ECDSA on curve {}", other.unwrap_or("(unnamed)")))
                }
                (other, _) => return Err(format!("algorithm {other}")),
            };
        Ok(Self {
            algorithm,
            key: spki.subject_public_key.data.to_vec(),
            kind,
        })
    }

    /// Whether `signature` is this key's signature of `message` (SHA-256).
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(self.algorithm, &self.key)
            .verify(message, signature)
            .is_ok()
    }

    /// The algorithm, for messages.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

/// The operator keys of `--recovery-trust-anchor`: any one may sign a grant.
#[derive(Debug, Clone)]
pub struct TrustAnchor {
    /// The file, for messages.
    pub path: PathBuf,
    keys: Vec<PublicKey>,
}

impl TrustAnchor {
    /// Reads every PUBLIC KEY and CERTIFICATE block of `path`. Other blocks
    /// (a private key put there by mistake) are not keys that may sign and
    /// are ignored; a file without one usable key is refused.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let bytes = std::fs::read(path).map_err(|e| KeyError::Unreadable {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
        Self::parse(path, &bytes)
    }

    /// [`TrustAnchor::load`] of bytes already read.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, KeyError> {
        let mut reader = bytes;
        let mut keys = Vec::new();
        let mut block = 0;
        loop {
            block += 1;
            let section =
                rustls_pki_types::pem::from_buf(&mut reader).map_err(|e| KeyError::Malformed {
                    path: path.to_owned(),
                    block,
                    why: e.to_string(),
                })?;
            let Some((kind, der)) = section else { break };
            let parsed = match kind {
                SectionKind::PublicKey => PublicKey::from_spki(&der),
                SectionKind::Certificate => X509Certificate::from_der(&der)
                    .map_err(|e| format!("not a certificate: {e}"))
                    .and_then(|(_, c)| PublicKey::from_parsed(c.public_key())),
                _ => continue,
            };
            match parsed {
                Ok(key) => keys.push(key),
                Err(why) if why.starts_with("not a") => {
                    return Err(KeyError::Malformed {
                        path: path.to_owned(),
                        block,
                        why,
                    })
                }
                Err(algorithm) => {
                    return Err(KeyError::Unsupported {
                        path: path.to_owned(),
                        block,
                        algorithm,
                    })
                }
            }
        }
        if keys.is_empty() {
            return Err(KeyError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            path: path.to_owned(),
            keys,
        })
    }

    /// Whether any key verifies `signature` over `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        self.keys.iter().any(|k| k.verifies(message, signature))
    }

    /// How many keys the file holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Never true for a loaded anchor (an empty file is refused).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A private key that signs SHA-256 signatures: RSA (PKCS#1 v1.5) or
/// ECDSA P-256 (ASN.1 DER), from PEM in PKCS#8, SEC1 or PKCS#1 form.
#[derive(Clone)]
pub struct PrivateSigner {
    key: Arc<dyn rustls::sign::Signer>,
}

impl fmt::Debug for PrivateSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} private key", self.key.scheme())
    }
}

impl PrivateSigner {
    /// The first private key of `pem`.
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let private = PrivateKeyDer::from_pem_slice(pem).map_err(|e| e.to_string())?;
        let signing =
            rustls::crypto::ring::sign::any_supported_type(&private).map_err(|e| e.to_string())?;
        let key = signing
            .choose_scheme(&[
                rustls::SignatureScheme::RSA_PKCS1_SHA256,
                rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
            ])
            .ok_or_else(|| {
                format!(
                    "a {:?} key cannot sign SHA-256 signatures; use RSA or ECDSA P-256",
                    signing.algorithm()
                )
            })?;
        Ok(Self {
            key: Arc::from(key),
        })
    }

    /// Signs `message` (SHA-256 inside). ECDSA signatures are randomized;
    /// RSA PKCS#1 v1.5 signatures are deterministic.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        self.key.sign(message).map_err(|e| e.to_string())
    }
}

/// The agent's server TLS identity as a snapshot signer.
#[derive(Clone)]
pub struct ServerSigner {
    key: PrivateSigner,
    public: PublicKey,
    /// Subject CN, or the first DNS SAN.
    pub identity: String,
    /// SHA-256 of the certificate's DER.
    pub certificate_sha256: Vec<u8>,
}

impl fmt::Debug for ServerSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "snapshot signer {} ({:?})", self.identity, self.public)
    }
}

impl ServerSigner {
    /// The signer of the server certificate (PEM, first block is the leaf)
    /// and its private key (PEM: PKCS#8, SEC1 or PKCS#1). The key must be
    /// RSA or ECDSA P-256 (it signs SHA-256 digests) and match the certificate.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, KeyError> {
        let identity_err = |path: &Path, why: String| KeyError::ServerIdentity {
            path: path.to_owned(),
            why,
        };
        let cert_pem = std::fs::read(cert).map_err(|e| identity_err(cert, e.to_string()))?;
        let key_pem = std::fs::read(key).map_err(|e| identity_err(key, e.to_string()))?;
        let der = first_certificate(&cert_pem)
            .ok_or_else(|| identity_err(cert, "no CERTIFICATE block in the file".into()))?;
        let (_, parsed) =
            X509Certificate::from_der(&der).map_err(|e| identity_err(cert, e.to_string()))?;
        let identity = certificate_name(&parsed).ok_or_else(|| KeyError::Nameless {
            path: cert.to_owned(),
        })?;
        let public = PublicKey::from_parsed(parsed.public_key())
            .map_err(|why| identity_err(cert, format!("its key is {why}")))?;
        let signer = PrivateSigner::from_pem(&key_pem).map_err(|why| identity_err(key, why))?;
        let me = Self {
            key: signer,
            public,
            identity,
            certificate_sha256: sha256(&der),
        };
        // Prove the pair: a key that is not the certificate's would sign
        // snapshots nobody can verify.
        const PROBE: &[u8] = b"pillar-csi recovery key check";
        let matches = me
            .sign(PROBE)
            .is_ok_and(|signature| me.verifies(PROBE, &signature));
        if !matches {
            return Err(identity_err(
                key,
                "the key does not match the certificate".into(),
            ));
        }
        Ok(me)
    }

    /// Signs `message` (SHA-256 inside).
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        self.key.sign(message)
    }

    /// Whether `signature` over `message` is this certificate's.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        self.public.verifies(message, signature)
    }
}

/// The DER of the first CERTIFICATE block.
fn first_certificate(pem: &[u8]) -> Option<Vec<u8>> {
    let mut reader = pem;
    while let Ok(Some((kind, der))) = rustls_pki_types::pem::from_buf(&mut reader) {
        if kind == SectionKind::Certificate {
            return Some(der);
        }
    }
    None
}

/// Subject CN, or the first DNS SAN.
fn certificate_name(cert: &X509Certificate<'_>) -> Option<String> {
    let cn = cert
        .subject()
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .find(|s| !s.is_empty())
        .map(str::to_owned);
    cn.or_else(|| {
        cert.subject_alternative_name()
            .ok()
            .flatten()
            .and_then(|san| {
                san.value.general_names.iter().find_map(|n| match n {
                    GeneralName::DNSName(d) if !d.is_empty() => Some((*d).to_owned()),
                    _ => None,
                })
            })
    })
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .to_vec()
}
