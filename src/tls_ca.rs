//! `xce-agent tls`: a cluster CA for sites without a PKI.
//!
//! `init DIR` writes `DIR/ca.pem` (ECDSA P-256, the CA every end trusts) and `DIR/ca.key`
//! (0600, DIR 0700). `issue --ca DIR --out OUT NAMES...` writes `OUT/NAME.pem` and
//! `OUT/NAME.key` (0600) per host, NAMES in the hostlist syntax of resources.yaml
//! (`node[001-128]`). Each certificate serves both ends of the link: serverAuth for a
//! controller, clientAuth for an agent; its SANs are the name and `NAME.DOMAIN`.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};

use crate::config::hostlist;

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
/// Host certificates default to 397 days, the longest the CA/Browser Forum allows: short
/// enough that a lost key stops working on its own.
pub const DEFAULT_HOST_DAYS: u32 = 397;
pub const DEFAULT_CA_DAYS: u32 = 3650;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: a CA is already there; remove it first to make a new one (every host certificate it signed would stop working)", path.display())]
    Exists { path: PathBuf },
    #[error("{0}")]
    Names(String),
    #[error("{what}: {source}")]
    Rcgen { what: String, source: rcgen::Error },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.to_owned(),
        source,
    }
}

fn rcgen_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> CaError {
    let what = what.into();
    move |source| CaError::Rcgen { what, source }
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // An hour of slack for clocks that run a little behind.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// Write `contents` to `path` with `mode`, through a temporary file and a rename so a reader
/// never sees half a key. `fresh` refuses to replace an existing file.
fn write_file(path: &Path, contents: &str, mode: u32, fresh: bool) -> Result<(), CaError> {
    if fresh && path.exists() {
        return Err(CaError::Exists {
            path: path.to_owned(),
        });
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(contents.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

fn make_dir(dir: &Path) -> Result<(), CaError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

/// A CA's common name, unique per CA: two CAs made by `tls init` (a test cluster's and the
/// real one's) never share a subject, so a certificate from the wrong one shows as signed by
/// another CA (by name) rather than as a bad signature from the same one.
fn ca_name(key: &KeyPair) -> String {
    // The public key's X coordinate after the 0x04 prefix: random per key.
    let id: String = key
        .public_key_raw()
        .iter()
        .skip(1)
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("xce cluster CA {id}")
}

/// Make a cluster CA in `dir`. Returns the files written.
pub fn init(dir: &Path, days: u32) -> Result<Vec<PathBuf>, CaError> {
    make_dir(dir)?;
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    for p in [&cert_path, &key_path] {
        if p.exists() {
            return Err(CaError::Exists { path: p.clone() });
        }
    }
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(rcgen_err("CA key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err("CA"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, ca_name(&key));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days);
    let cert = params.self_signed(&key).map_err(rcgen_err("CA"))?;
    write_file(&key_path, &key.serialize_pem(), 0o600, true)?;
    write_file(&cert_path, &cert.pem(), 0o644, true)?;
    Ok(vec![cert_path, key_path])
}

/// Issue a certificate and key for every host in `patterns` (hostlist syntax), signed by
/// the CA in `ca_dir`, into `out`. Returns the files written.
pub fn issue(
    ca_dir: &Path,
    out: &Path,
    patterns: &[String],
    domain: Option<&str>,
    days: u32,
) -> Result<Vec<PathBuf>, CaError> {
    let mut hosts = Vec::new();
    for p in patterns {
        let expanded = hostlist::expand(p).map_err(|e| CaError::Names(format!("{p:?}: {e}")))?;
        for h in expanded {
            hostlist::validate_host_name(&h).map_err(|e| CaError::Names(format!("{h:?}: {e}")))?;
            hosts.push(h);
        }
    }
    if let Some(d) = domain {
        hostlist::validate_host_name(d)
            .map_err(|e| CaError::Names(format!("--domain {d:?}: {e}")))?;
    }
    let cert_path = ca_dir.join(CA_CERT);
    let key_path = ca_dir.join(CA_KEY);
    let ca_pem = std::fs::read_to_string(&cert_path).map_err(io_err(&cert_path))?;
    let ca_key_pem = std::fs::read_to_string(&key_path).map_err(io_err(&key_path))?;
    let ca_key =
        KeyPair::from_pem(&ca_key_pem).map_err(rcgen_err(key_path.display().to_string()))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(rcgen_err(cert_path.display().to_string()))?;
    make_dir(out)?;
    let mut written = Vec::new();
    for host in &hosts {
        let mut names = vec![host.clone()];
        if let Some(d) = domain {
            names.push(format!("{host}.{d}"));
        }
        let mut params = CertificateParams::new(names).map_err(rcgen_err(host.as_str()))?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, days);
        let key =
            KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(rcgen_err(host.as_str()))?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(rcgen_err(host.as_str()))?;
        let (c, k) = (
            out.join(format!("{host}.pem")),
            out.join(format!("{host}.key")),
        );
        write_file(&k, &key.serialize_pem(), 0o600, false)?;
        write_file(&c, &cert.pem(), 0o644, false)?;
        written.extend([c, k]);
    }
    Ok(written)
}
