//! Key material for the TLS tests: a CA made with rcgen (for the odd certificates a test
//! needs: expired, revoked, another CA's) and one made with the `openssl` CLI, as a site
//! PKI would. Files land in a temp dir with the modes the agent requires.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SerialNumber,
};
use xce_agent::config::agent::TlsPaths;
use xce_agent::link::tls::Material;

/// One end's files.
#[derive(Debug, Clone)]
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA in a temp dir that issues host certificates.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    next_serial: u64,
    revoked: Vec<u64>,
}

fn write_key(path: &Path, pem: &str) {
    std::fs::write(path, pem).expect("write key");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
}

impl Pki {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("CA cert");
        let ca = dir.path().join(format!("{name}.pem"));
        std::fs::write(&ca, cert.pem()).expect("write CA");
        Self {
            dir,
            ca,
            issuer: Issuer::new(params, key),
            next_serial: 1,
            revoked: Vec::new(),
        }
    }

    /// A certificate for `sans` (the first is also the file name), valid from `from` to
    /// `until` days from now.
    pub fn issue_valid(&mut self, sans: &[&str], from: i64, until: i64) -> Files {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, sans[0]);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.serial_number = Some(SerialNumber::from(self.next_serial));
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(from);
        params.not_after = now + time::Duration::days(until);
        let key = KeyPair::generate().expect("host key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let base = format!("{}-{}", sans[0], self.next_serial);
        self.next_serial += 1;
        let files = Files {
            cert: self.dir.path().join(format!("{base}.pem")),
            key: self.dir.path().join(format!("{base}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("write cert");
        write_key(&files.key, &key.serialize_pem());
        files
    }

    /// Valid for a year: outside `tls.expiry_warning`'s default window.
    pub fn issue(&mut self, sans: &[&str]) -> Files {
        self.issue_valid(sans, -1, 365)
    }

    /// The serial the next `issue` will use.
    pub fn next_serial(&self) -> u64 {
        self.next_serial
    }

    /// Write a CRL revoking `serials`; returns its path.
    pub fn crl(&mut self, serials: &[u64]) -> PathBuf {
        self.revoked.extend_from_slice(serials);
        let now = time::OffsetDateTime::now_utc();
        let params = CertificateRevocationListParams {
            this_update: now - time::Duration::hours(1),
            next_update: now + time::Duration::days(7),
            crl_number: SerialNumber::from(self.revoked.len() as u64),
            issuing_distribution_point: None,
            revoked_certs: self
                .revoked
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(*s),
                    revocation_time: now - time::Duration::minutes(5),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer).expect("sign CRL");
        let path = self.dir.path().join("ca.crl");
        std::fs::write(&path, crl.pem().expect("CRL PEM")).expect("write CRL");
        path
    }

    pub fn paths(&self, f: &Files) -> TlsPaths {
        TlsPaths {
            ca: self.ca.clone(),
            cert: f.cert.clone(),
            key: f.key.clone(),
            crl: None,
        }
    }
}

pub fn material(paths: &TlsPaths) -> Material {
    Material::load(paths).unwrap_or_else(|e| panic!("key material: {e}"))
}

pub fn client(paths: &TlsPaths) -> Arc<rustls::ClientConfig> {
    material(paths).client_config().expect("client config")
}

pub fn server(paths: &TlsPaths) -> Arc<rustls::ServerConfig> {
    material(paths).server_config().expect("server config")
}

/// Whether the `openssl` CLI is installed (CI installs it); says so when it is not.
pub fn openssl_available() -> bool {
    let ok = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("NOTE: `openssl` not installed; skipping the interop test (CI installs it)");
    }
    ok
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A site PKI made with the openssl CLI: `ca.pem`, and for each (name, SAN list) a
/// certificate `name.pem` and key `name.key` (PKCS#8 P-256, mode 0600).
pub fn openssl_pki(dir: &Path, hosts: &[(&str, &str)]) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "365",
            "-subj",
            "/CN=site CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    for (name, sans) in hosts {
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let cert = format!("{name}.pem");
        let ext = format!("{name}.ext");
        std::fs::write(
            dir.join(&ext),
            format!("subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        )
        .expect("write ext");
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "365",
                "-extfile",
                &ext,
                "-out",
                &cert,
            ],
        );
        std::fs::set_permissions(dir.join(&key), std::fs::Permissions::from_mode(0o600))
            .expect("chmod key");
    }
    dir.join("ca.pem")
}

pub fn openssl_paths(dir: &Path, name: &str) -> TlsPaths {
    TlsPaths {
        ca: dir.join("ca.pem"),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
        crl: None,
    }
}
