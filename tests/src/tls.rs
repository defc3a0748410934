//! Certificates for mTLS tests, made with the `openssl` CLI (test set-up only):
//! a CA, server certificates with an IP subject alternative name, and client
//! certificates, each an ECDSA P-256 key in PKCS#8 PEM.
use crate::{run, Result};
use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
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

    /// A client certificate named `name` that expired a year ago (valid
    /// for one day in 2025), signed by this CA.
    pub fn expired_client(&self, name: &str) -> Result<Pem> {
        self.signed_between(
            name,
            &format!("extendedKeyUsage=clientAuth\nsubjectAltName=DNS:{name}\n"),
            "20250101000000Z",
            "20250102000000Z",
        )
    }

    /// A server certificate for `ip` (as [`Ca::server`]) that expires
    /// `valid_for` from now (whole seconds; valid since a minute ago).
    pub fn short_lived_server(&self, name: &str, ip: IpAddr, valid_for: Duration) -> Result<Pem> {
        let (start, end) = from_now(valid_for)?;
        self.signed_between(
            name,
            &format!("extendedKeyUsage=serverAuth\nsubjectAltName=IP:{ip}\n"),
            &start,
            &end,
        )
    }

    /// A client certificate (as [`Ca::client`]) that expires `valid_for`
    /// from now (whole seconds; valid since a minute ago).
    pub fn short_lived_client(&self, name: &str, valid_for: Duration) -> Result<Pem> {
        let (start, end) = from_now(valid_for)?;
        self.signed_between(
            name,
            &format!("extendedKeyUsage=clientAuth\nsubjectAltName=DNS:{name}\n"),
            &start,
            &end,
        )
    }

    /// A certificate named `name` with `extensions`, valid from `start` to
    /// `end` (`YYYYMMDDHHMMSSZ`), signed by this CA through `openssl ca`
    /// (`openssl x509` takes whole days only).
    fn signed_between(&self, name: &str, extensions: &str, start: &str, end: &str) -> Result<Pem> {
        let pem = self.request(name)?;
        let db = self.dir.join(format!("{name}.db"));
        fs::create_dir_all(&db)?;
        fs::write(db.join("index.txt"), "")?;
        fs::write(db.join("serial"), "1000\n")?;
        let config = db.join("ca.cnf");
        fs::write(
            &config,
            format!(
                "[ca]\ndefault_ca = lab\n[lab]\ndatabase = {db}/index.txt\nnew_certs_dir = {db}\nserial = {db}/serial\ndefault_md = sha256\npolicy = any\n[any]\ncommonName = supplied\n",
                db = path_str(&db)?
            ),
        )?;
        let ext = self.extensions(name, extensions)?;
        run(
            "openssl",
            &[
                "ca",
                "-batch",
                "-notext",
                "-config",
                path_str(&config)?,
                "-cert",
                path_str(&self.pem.cert)?,
                "-keyfile",
                path_str(&self.pem.key)?,
                "-startdate",
                start,
                "-enddate",
                end,
                "-extfile",
                path_str(&ext)?,
                "-in",
                path_str(&self.dir.join(format!("{name}.csr")))?,
                "-out",
                path_str(&pem.cert)?,
            ],
        )?;
        Ok(pem)
    }

    /// A certificate named `name` for servers only (extended key usage
    /// serverAuth, no clientAuth), signed by this CA: not a client's.
    pub fn server_only(&self, name: &str) -> Result<Pem> {
        self.issue(
            name,
            &format!("extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{name}\n"),
        )
    }

    /// The extension file of a leaf certificate named `name`.
    fn extensions(&self, name: &str, extensions: &str) -> Result<PathBuf> {
        let ext = self.dir.join(format!("{name}.ext"));
        fs::write(
            &ext,
            format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"
            ),
        )?;
        Ok(ext)
    }

    /// A new key for `name` and its certificate request (`<name>.csr`); the
    /// returned paths are where the key is and the certificate goes.
    fn request(&self, name: &str) -> Result<Pem> {
        let pem = Pem {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        let csr = self.dir.join(format!("{name}.csr"));
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
        Ok(pem)
    }

    fn issue(&self, name: &str, extensions: &str) -> Result<Pem> {
        let pem = self.request(name)?;
        let csr = self.dir.join(format!("{name}.csr"));
        let ext = self.extensions(name, extensions)?;
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

/// `openssl ca` dates (UTC, `YYYYMMDDHHMMSSZ`) of a minute ago and of
/// `valid_for` from now.
fn from_now(valid_for: Duration) -> Result<(String, String)> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let at = |secs: u64| -> Result<String> {
        let out = run("date", &["-u", "-d", &format!("@{secs}"), "+%Y%m%d%H%M%SZ"])?;
        Ok(out.trim().to_owned())
    };
    Ok((at(now.saturating_sub(60))?, at(now + valid_for.as_secs())?))
}

/// A folder laid out as kubelet mounts a Secret: `tls.crt`, `tls.key` and
/// `ca.crt` are symlinks through the `..data` symlink into a folder of the
/// Secret's version, and a renewal ([`Projected::swap`]) writes a new
/// version folder and swaps `..data` to it with one rename, so a reader
/// sees the old files or the new ones, never a mix.
#[derive(Debug)]
pub struct Projected {
    dir: PathBuf,
    version: u32,
    /// The mounted certificate and key (`tls.crt`, `tls.key`).
    pub pem: Pem,
    /// The mounted CA (`ca.crt`).
    pub ca: PathBuf,
}

impl Projected {
    /// `pem` and the CA `ca` mounted under `dir` (created).
    pub fn new(dir: &Path, pem: &Pem, ca: &Path) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let mut projected = Projected {
            dir: dir.to_owned(),
            version: 0,
            pem: Pem {
                cert: dir.join("tls.crt"),
                key: dir.join("tls.key"),
            },
            ca: dir.join("ca.crt"),
        };
        projected.swap(pem, ca)?;
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name))?;
        }
        Ok(projected)
    }

    /// Renews the mounted files in place with `pem` and `ca`, as kubelet
    /// does when cert-manager renews the Secret.
    pub fn swap(&mut self, pem: &Pem, ca: &Path) -> Result<()> {
        self.version += 1;
        let name = format!("..v{}", self.version);
        let version = self.dir.join(&name);
        fs::create_dir(&version)?;
        fs::copy(&pem.cert, version.join("tls.crt"))?;
        fs::copy(&pem.key, version.join("tls.key"))?;
        fs::copy(ca, version.join("ca.crt"))?;
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp)?;
        fs::rename(&tmp, self.dir.join("..data"))?;
        if self.version > 1 {
            fs::remove_dir_all(self.dir.join(format!("..v{}", self.version - 1)))?;
        }
        Ok(())
    }
}
