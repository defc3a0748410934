//! Certificates for mTLS tests, made with the `openssl` CLI (test set-up only):
//! a CA, server certificates with an IP subject alternative name, and client
//! certificates, each an ECDSA P-256 key in PKCS#8 PEM.
use crate::{run, Result};
use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

/// A certificate and its private key, both PEM files.
#[derive(Debug, Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// A certificate authority in a folder of its own.
#[derive(Debug, Clone)]
pub struct Ca {
    /// The CA's certificate and key.
    pub pem: Pem,
    dir: PathBuf,
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| format!("path {} is not UTF-8", p.display()).into())
}

impl Ca {
    /// A self-signed CA named `name` (its common name), written under `dir/name/`.
    pub fn new(dir: &Path, name: &str) -> Result<Self> {
        let dir = dir.join(name);
        fs::create_dir_all(&dir)?;
        let pem = Pem {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        };
        run(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "3",
                "-subj",
                &format!("/CN={name}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                path_str(&pem.key)?,
                "-out",
                path_str(&pem.cert)?,
            ],
        )?;
        Ok(Self { pem, dir })
    }

    /// A server certificate for `ip` (common name and IP SAN) signed by this CA.
    pub fn server(&self, name: &str, ip: IpAddr) -> Result<Pem> {
        self.issue(
            name,
            &format!("extendedKeyUsage=serverAuth\nsubjectAltName=IP:{ip}\n"),
        )
    }

    /// A client certificate named `name` signed by this CA.
    pub fn client(&self, name: &str) -> Result<Pem> {
        self.issue(
            name,
            &format!("extendedKeyUsage=clientAuth\nsubjectAltName=DNS:{name}\n"),
        )
    }

    fn issue(&self, name: &str, extensions: &str) -> Result<Pem> {
        let pem = Pem {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        let csr = self.dir.join(format!("{name}.csr"));
        let ext = self.dir.join(format!("{name}.ext"));
        fs::write(
            &ext,
            format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"
            ),
        )?;
        run(
            "openssl",
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                path_str(&pem.key)?,
                "-out",
                path_str(&csr)?,
            ],
        )?;
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                path_str(&csr)?,
                "-CA",
                path_str(&self.pem.cert)?,
                "-CAkey",
                path_str(&self.pem.key)?,
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                path_str(&ext)?,
                "-out",
                path_str(&pem.cert)?,
            ],
        )?;
        Ok(pem)
    }
}
