//! TLS 1.3 on the link (rustls, ring provider), with a certificate on both ends.
//!
//! - The agent verifies the controller's certificate against the site CA and against the
//!   name it dialed (DNS SAN, or IP SAN for an address), and presents its own certificate.
//! - The receiver requires a client certificate from the same CA, and accepts a host's
//!   values only when the hello's host matches one of that certificate's DNS SANs
//!   ([`cert_names_host`]: equal to a SAN, ignoring case, or the short form of a SAN inside
//!   one of the cluster's configured domains; nothing else, as RFC 6125 / webpki and
//!   Kubernetes' NodeRestriction bind names).
//!
//! Key material is read from PEM files (any site PKI, or `xce-agent tls`); a private key
//! that group or others can read, or that someone else owns, is refused with the fix.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::agent::TlsPaths;

/// A handshake that has not finished by then is abandoned: a peer that stalls mid-handshake
/// must not hold a connection slot (or the agent's reconnect loop) for longer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A PEM file larger than this is not key material (a wrong path pointing at a log).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// A connection on the link: plain TCP or TLS over it.
pub trait LinkStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> LinkStream for T {}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {why}", path.display())]
    Pem { path: PathBuf, why: String },
    #[error(
        "{}: the private key is readable by group or others (mode {mode:04o}); fix: chmod 600 {}",
        path.display(), path.display()
    )]
    KeyMode { path: PathBuf, mode: u32 },
    #[error(
        "{}: the private key is owned by uid {uid}, not root or the agent's user (uid {me}); fix: chown {me} {}",
        path.display(), path.display()
    )]
    KeyOwner { path: PathBuf, uid: u32, me: u32 },
    #[error("{}: the private key does not match the certificate in {}", key.display(), cert.display())]
    KeyMismatch { key: PathBuf, cert: PathBuf },
    #[error("{}: {why}", path.display())]
    Crl { path: PathBuf, why: String },
    #[error("TLS setup: {0}")]
    Setup(String),
    #[error(
        "{}: this host's certificate expired on {not_after}: the controller will refuse it; install a renewed one (xce-agent tls issue, or the site's PKI) and reload",
        path.display()
    )]
    Expired { path: PathBuf, not_after: String },
    #[error(
        "{}: this host's certificate is not valid before {not_before} (is this machine's clock right?)",
        path.display()
    )]
    NotYetValid { path: PathBuf, not_before: String },
    #[error(
        "{}: this host's certificate names [{}], not this host {host:?}: the controller accepts a host only when the certificate names it; issue one for {host} (xce-agent tls issue ... {host}), or set `host:` in agent.yaml to the name it carries",
        path.display(), sans.join(", ")
    )]
    WrongHost {
        path: PathBuf,
        host: String,
        sans: Vec<String>,
    },
    #[error(
        "{}: this host's certificate (issuer {issuer:?}) does not chain to the CA in {}: {why}; the controller will refuse it; issue one from that CA (xce-agent tls issue, or the site's PKI), or point tls.ca at the CA that issued it",
        cert.display(), ca.display()
    )]
    NotFromCa {
        cert: PathBuf,
        ca: PathBuf,
        issuer: String,
        why: String,
    },
}

/// The key material of one end, read and checked; turned into rustls configs on demand.
#[derive(Debug, Clone)]
pub struct Material {
    pub paths: TlsPaths,
    roots: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key_pem: Vec<u8>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    /// Every file's bytes, in order: a reload compares them to see whether anything rotated.
    contents: Vec<u8>,
}

impl PartialEq for Material {
    fn eq(&self, other: &Self) -> bool {
        self.paths == other.paths && self.contents == other.contents
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    let err = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    if !meta.is_file() || meta.len() > MAX_PEM_BYTES {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            why: format!("not a regular PEM file of at most {MAX_PEM_BYTES} bytes"),
        });
    }
    std::fs::read(path).map_err(err)
}

/// Refuse a private key that anyone but its owner may read, or that is owned by anyone but
/// root or the user reading it (as sshd does for host keys).
pub fn check_key_file(path: &Path) -> Result<(), TlsError> {
    let meta = std::fs::metadata(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyMode {
            path: path.to_owned(),
            mode,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(TlsError::KeyOwner {
            path: path.to_owned(),
            uid: meta.uid(),
            me,
        });
    }
    Ok(())
}

fn certs(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            why: format!("bad PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            why: "no certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        });
    }
    for c in &certs {
        if x509_parser::parse_x509_certificate(c).is_err() {
            return Err(TlsError::Pem {
                path: path.to_owned(),
                why: "a CERTIFICATE block is not a valid X.509 certificate".into(),
            });
        }
    }
    Ok(certs)
}

/// Every CRL must be signed by one of the CA certificates. The verifier would ignore a CRL
/// of another CA (it revokes nothing here), so a wrong file would silently turn revocation
/// off: refused at load instead.
fn check_crls_signed_by(
    crls: &[CertificateRevocationListDer<'_>],
    roots: &[CertificateDer<'_>],
    crl_path: &Path,
    ca_path: &Path,
) -> Result<(), TlsError> {
    use x509_parser::prelude::FromDer as _;
    use x509_parser::revocation_list::CertificateRevocationList;
    for (i, der) in crls.iter().enumerate() {
        let crl = CertificateRevocationList::from_der(der)
            .map(|(_, c)| c)
            .map_err(|e| TlsError::Crl {
                path: crl_path.to_owned(),
                why: format!("CRL {} does not parse: {e}", i + 1),
            })?;
        let signed = roots.iter().any(|ca| {
            x509_parser::parse_x509_certificate(ca)
                .is_ok_and(|(_, ca)| crl.verify_signature(ca.public_key()).is_ok())
        });
        if !signed {
            return Err(TlsError::Crl {
                path: crl_path.to_owned(),
                why: format!(
                    "the CRL of {:?} is not signed by a CA in {} (a CRL of another CA would \
                     revoke nothing)",
                    crl.issuer().to_string(),
                    ca_path.display()
                ),
            });
        }
    }
    Ok(())
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Material {
    /// Read ca, cert, key (permissions checked first) and crl, and check that they fit
    /// together: the key matches the certificate, the CRL parses.
    pub fn load(paths: &TlsPaths) -> Result<Self, TlsError> {
        let ca_pem = read_pem(&paths.ca)?;
        let roots = certs(&paths.ca, &ca_pem)?;
        let cert_pem = read_pem(&paths.cert)?;
        let chain = certs(&paths.cert, &cert_pem)?;
        check_key_file(&paths.key)?;
        let key_pem = read_pem(&paths.key)?;
        let mut crls = Vec::new();
        let mut contents = [ca_pem, cert_pem, key_pem.clone()].concat();
        if let Some(crl) = &paths.crl {
            let crl_pem = read_pem(crl)?;
            crls = CertificateRevocationListDer::pem_slice_iter(&crl_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::Crl {
                    path: crl.clone(),
                    why: format!("bad PEM: {e}"),
                })?;
            if crls.is_empty() {
                return Err(TlsError::Crl {
                    path: crl.clone(),
                    why: "no X509 CRL block in it".into(),
                });
            }
            check_crls_signed_by(&crls, &roots, crl, &paths.ca)?;
            contents.extend_from_slice(&crl_pem);
        }
        let material = Self {
            paths: paths.clone(),
            roots,
            chain,
            key_pem,
            crls,
            contents,
        };
        // Building both configs checks the key against the certificate and parses the CRL.
        material.server_config()?;
        Ok(material)
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| TlsError::Pem {
            path: self.paths.key.clone(),
            why: format!("no private key (PKCS#8, SEC1 or RSA PEM) in it: {e}"),
        })
    }

    fn root_store(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in &self.roots {
            roots.add(c.clone()).map_err(|e| TlsError::Pem {
                path: self.paths.ca.clone(),
                why: format!("not a usable CA certificate: {e}"),
            })?;
        }
        Ok(Arc::new(roots))
    }

    fn setup_error(&self, e: rustls::Error) -> TlsError {
        match e {
            rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
                key: self.paths.key.clone(),
                cert: self.paths.cert.clone(),
            },
            e => TlsError::Setup(e.to_string()),
        }
    }

    fn crl_error(&self, e: impl std::fmt::Display) -> TlsError {
        match &self.paths.crl {
            Some(path) => TlsError::Crl {
                path: path.clone(),
                why: e.to_string(),
            },
            None => TlsError::Setup(e.to_string()),
        }
    }

    /// The agent's side: verify the controller against the CA (and CRL), present our chain.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let verifier = WebPkiServerVerifier::builder_with_provider(self.root_store()?, provider())
            .with_crls(self.crls.clone())
            .allow_unknown_revocation_status()
            .build()
            .map_err(|e| self.crl_error(e))?;
        let cfg = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_webpki_verifier(verifier)
            .with_client_auth_cert(self.chain.clone(), self.key()?)
            .map_err(|e| self.setup_error(e))?;
        Ok(Arc::new(cfg))
    }

    /// The receiver's side: require a client certificate from the CA (and not revoked: the
    /// CRLs are checked for every certificate of the chain, so a revoked intermediate CA is
    /// refused too; a certificate whose issuer has no CRL here is not checked).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(self.root_store()?, provider())
            .with_crls(self.crls.clone())
            .allow_unknown_revocation_status()
            .build()
            .map_err(|e| self.crl_error(e))?;
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key()?)
            .map_err(|e| self.setup_error(e))?;
        // Room for every agent of a large cluster to resume after a reconnect storm.
        cfg.session_storage = rustls::server::ServerSessionMemoryCache::new(16 * 1024);
        Ok(Arc::new(cfg))
    }

    /// The certificates its CRLs revoke, as [`certificate_key`]s: what a reload ends among
    /// the live sessions.
    pub fn revoked_keys(&self) -> Vec<String> {
        use x509_parser::prelude::FromDer as _;
        use x509_parser::revocation_list::CertificateRevocationList;
        let mut keys = Vec::new();
        for der in &self.crls {
            if let Ok((_, crl)) = CertificateRevocationList::from_der(der) {
                let issuer = crl.issuer().to_string();
                keys.extend(
                    crl.iter_revoked_certificates()
                        .map(|r| certificate_key(&issuer, &r.raw_serial_as_string())),
                );
            }
        }
        keys
    }

    /// This end's own certificate (the first of the chain).
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }

    /// Unix seconds at which this end's certificate expires.
    pub fn leaf_not_after(&self) -> Option<i64> {
        cert_info(self.leaf()).map(|i| i.not_after)
    }

    /// Whether this end's certificate can speak for `host` at `now`: valid now, and naming
    /// `host` by the rule the receiver applies. What the controller would refuse is refused
    /// here first, where the admin is looking, instead of as a TLS error in a reconnect
    /// loop. `Ok(Some(text))`: usable, but it expires within `warn_before`.
    pub fn usable_for(
        &self,
        host: &str,
        now: SystemTime,
        warn_before: Duration,
    ) -> Result<Option<String>, TlsError> {
        let Some(info) = cert_info(self.leaf()) else {
            return Ok(None);
        };
        let path = &self.paths.cert;
        let now = unix(now);
        if info.not_after < now {
            return Err(TlsError::Expired {
                path: path.clone(),
                not_after: rfc3339(info.not_after),
            });
        }
        if info.not_before > now {
            return Err(TlsError::NotYetValid {
                path: path.clone(),
                not_before: rfc3339(info.not_before),
            });
        }
        // The receiver's rule, with the domains the controller is configured with unknown
        // here: exactly, or as HOST.DOMAIN for a DOMAIN of the certificate's own (accepted
        // where the controller lists that domain, which is said).
        let own_domains: Vec<String> = info
            .dns_names
            .iter()
            .filter_map(|san| san.split_once('.').map(|(_, d)| d.to_owned()))
            .collect();
        if !cert_names_host(&info.dns_names, host, &own_domains) {
            return Err(TlsError::WrongHost {
                path: path.clone(),
                host: host.to_owned(),
                sans: info.sans,
            });
        }
        self.chains_to_ca(now)?;
        let mut warnings = Vec::new();
        if !cert_names_host(&info.dns_names, host, &[]) {
            warnings.push(format!(
                "{}: this host's certificate names {host} only with a domain ({}): the controller accepts it only where it is configured with that domain (listen --domain, xce_receiver_config_add_domain)",
                path.display(),
                info.dns_names.join(", ")
            ));
        }
        let left = info.not_after - now;
        if left < warn_before.as_secs() as i64 {
            warnings.push(expiry_warning(path, &info, left));
        }
        Ok((!warnings.is_empty()).then(|| warnings.join("; ")))
    }
}

impl Material {
    /// Whether this end's chain leads to the configured CA as the controller checks it (the
    /// same webpki verifier, CRLs included), at `now` moved into the leaf's validity (an
    /// expired leaf has its own message; this one is about the chain). The links' own
    /// configs do not check this: a certificate from another CA only fails at the peer, as
    /// "unknown CA" in a reconnect loop.
    pub fn chains_to_ca(&self, now: i64) -> Result<(), TlsError> {
        let Some(leaf) = cert_info(self.leaf()) else {
            return Ok(());
        };
        let now = now.clamp(leaf.not_before, leaf.not_after.max(leaf.not_before));
        use rustls::CertificateError as C;
        let verifier = WebPkiClientVerifier::builder_with_provider(self.root_store()?, provider())
            .with_crls(self.crls.clone())
            .allow_unknown_revocation_status()
            .build()
            .map_err(|e| self.crl_error(e))?;
        let at =
            rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(now.max(0) as u64));
        let Err(e) = verifier.verify_client_cert(self.leaf(), &self.chain[1..], at) else {
            return Ok(());
        };
        let why = match e {
            rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
                let cas: Vec<String> = self
                    .roots
                    .iter()
                    .filter_map(cert_info)
                    .map(|c| format!("{:?}", c.subject))
                    .collect();
                format!(
                    "no CA there issued it (that file holds {}; the chain in {} holds {} certificate(s))",
                    cas.join(", "),
                    self.paths.cert.display(),
                    self.chain.len()
                )
            }
            rustls::Error::InvalidCertificate(C::BadSignature) => {
                "its signature does not verify with the CA's key (a CA of that name, not the one that signed it)".to_owned()
            }
            rustls::Error::InvalidCertificate(C::Revoked) => match &self.paths.crl {
                Some(crl) => format!("it is revoked by {}", crl.display()),
                None => "it is revoked".to_owned(),
            },
            rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
                "a CA certificate of its chain has expired".to_owned()
            }
            e => plain(&e.to_string()),
        };
        Err(TlsError::NotFromCa {
            cert: self.paths.cert.clone(),
            ca: self.paths.ca.clone(),
            issuer: leaf.issuer.clone(),
            why,
        })
    }
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn expiry_warning(path: &Path, info: &CertInfo, left: i64) -> String {
    format!(
        "{}: certificate {:?} expires in {} days ({}): renew it",
        path.display(),
        info.subject,
        left / 86_400,
        rfc3339(info.not_after)
    )
}

/// What `check` prints about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub subject: String,
    pub issuer: String,
    /// DNS names, then IP addresses.
    pub sans: Vec<String>,
    pub dns_names: Vec<String>,
    /// The serial number, hex: with the issuer, what names this one certificate.
    pub serial: String,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

/// What names one certificate: its issuer and serial number (as a CRL names it).
pub fn certificate_key(issuer: &str, serial: &str) -> String {
    format!("{issuer} #{serial}")
}

pub fn cert_info(der: &CertificateDer<'_>) -> Option<CertInfo> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut dns_names = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns_names.push((*d).to_owned()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => ips
                        .push(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                    16 => ips
                        .push(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    let mut sans = dns_names.clone();
    sans.extend(ips);
    Some(CertInfo {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        sans,
        dns_names,
        serial: cert.raw_serial_as_string(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// Whether a certificate with these DNS SANs may speak for `host`: `host` equals a SAN
/// (ASCII case ignored), or `host` is a short name (no dot) and `host.DOMAIN` is a SAN for one
/// of the cluster's `domains`. A SAN `node001.evil` does not speak for `node001`, nor does
/// `node001` for `node001.cluster.example`.
pub fn cert_names_host(dns_names: &[String], host: &str, domains: &[String]) -> bool {
    let short = !host.contains('.');
    dns_names.iter().any(|san| {
        if san.eq_ignore_ascii_case(host) {
            return true;
        }
        short
            && san.len() > host.len() + 1
            && san.as_bytes()[host.len()] == b'.'
            && san.is_char_boundary(host.len())
            && san[..host.len()].eq_ignore_ascii_case(host)
            && domains
                .iter()
                .any(|d| san[host.len() + 1..].eq_ignore_ascii_case(d.trim_end_matches('.')))
    })
}

/// The name the agent expects on the controller's certificate: the host part of a
/// `controllers:` entry (`host:port`, `[v6]:port`, `v4:port`).
pub fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, BadServerName> {
    let host = match addr.rsplit_once(':') {
        Some((h, port)) if port.parse::<u16>().is_ok() && !h.ends_with(':') => h,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| BadServerName {
        host: host.to_owned(),
        reason: e.to_string(),
    })
}

/// A controller address whose host part no certificate can carry as a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{host:?} is not a name a certificate can carry: {reason}")]
pub struct BadServerName {
    pub host: String,
    pub reason: String,
}

/// Why a handshake failed, as a short label for counters and log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The peer's certificate is not from our CA.
    UnknownCa,
    Expired,
    Revoked,
    /// The certificate is valid but for another name.
    WrongName,
    /// The peer sent no certificate.
    NoCertificate,
    /// The peer refused us (sent an alert: e.g. it does not trust our certificate).
    PeerRefused,
    /// The peer turned the connection away before the handshake (the receiver's
    /// `user_canceled` alert, [`crate::receiver::admission::BUSY_ALERT`]: too many connections
    /// waiting for theirs).
    Busy,
    /// The peer does not speak TLS (a plaintext receiver, garbage bytes).
    NotTls,
    /// The connection ended before the handshake did.
    Truncated,
    /// The peer stalled past [`HANDSHAKE_TIMEOUT`].
    Timeout,
    Other,
}

impl Failure {
    pub const ALL: [Failure; 11] = [
        Failure::UnknownCa,
        Failure::Expired,
        Failure::Revoked,
        Failure::WrongName,
        Failure::NoCertificate,
        Failure::PeerRefused,
        Failure::Busy,
        Failure::NotTls,
        Failure::Truncated,
        Failure::Timeout,
        Failure::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::UnknownCa => "unknown_ca",
            Failure::Expired => "expired",
            Failure::Revoked => "revoked",
            Failure::WrongName => "wrong_name",
            Failure::NoCertificate => "no_certificate",
            Failure::PeerRefused => "peer_refused",
            Failure::Busy => "busy",
            Failure::NotTls => "not_tls",
            Failure::Truncated => "truncated",
            Failure::Timeout => "timeout",
            Failure::Other => "other",
        }
    }

    pub fn index(self) -> usize {
        Self::ALL.iter().position(|f| *f == self).unwrap_or(0)
    }

    /// A failure of TLS itself (not of the TCP under it): the peer's alert, a bad record.
    pub fn of_tls(e: &std::io::Error) -> Option<Self> {
        e.get_ref()
            .is_some_and(|i| i.is::<rustls::Error>())
            .then(|| Self::of(e))
    }

    /// Classify the error a tokio-rustls handshake returned.
    pub fn of(e: &std::io::Error) -> Self {
        use rustls::{CertificateError as C, Error as E};
        if e.kind() == std::io::ErrorKind::TimedOut {
            return Failure::Timeout;
        }
        let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<E>()) else {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe => Failure::Truncated,
                _ => Failure::Other,
            };
        };
        match tls {
            E::InvalidCertificate(c) => match c {
                C::UnknownIssuer | C::BadSignature | C::UnknownRevocationStatus => {
                    Failure::UnknownCa
                }
                C::Expired | C::ExpiredContext { .. } | C::NotValidYet => Failure::Expired,
                C::NotValidYetContext { .. } => Failure::Expired,
                C::Revoked => Failure::Revoked,
                C::NotValidForName | C::NotValidForNameContext { .. } => Failure::WrongName,
                _ => Failure::Other,
            },
            E::NoCertificatesPresented => Failure::NoCertificate,
            E::AlertReceived(rustls::AlertDescription::UserCanceled) => Failure::Busy,
            E::AlertReceived(_) => Failure::PeerRefused,
            E::InvalidMessage(_) => Failure::NotTls,
            _ => Failure::Other,
        }
    }
}

/// The TLS failure a read hit, kept for whoever owns the connection: the frame reader
/// above turns the error into text.
pub type FailureSlot = Arc<std::sync::Mutex<Option<(Failure, String)>>>;

/// A reader that records a TLS failure in its slot. In TLS 1.3 the client's handshake is
/// over before the server has checked the client's certificate, so a controller's refusal
/// arrives as an alert on the first read, not as a handshake error.
pub struct WatchFailure<R> {
    inner: R,
    slot: FailureSlot,
}

impl<R> WatchFailure<R> {
    pub fn new(inner: R, slot: FailureSlot) -> Self {
        Self { inner, slot }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for WatchFailure<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Err(e)) = &r {
            if let Some(why) = Failure::of_tls(e) {
                let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
                *slot = Some((why, e.to_string()));
            }
        }
        r
    }
}

/// A handshake error's text without tokio-rustls' wrapping or a library's URL.
pub fn describe(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::TimedOut {
        return format!("no handshake within {HANDSHAKE_TIMEOUT:?} (peer stalled)");
    }
    plain(&e.to_string())
}

/// A failed accept as the controller reads it: an agent that refuses the controller's
/// certificate ends the handshake with an alert, which is named with what it means (not
/// "tls handshake eof" or a bare alert name); anything else as [`describe`] says it.
pub fn describe_accept(e: &std::io::Error) -> String {
    use rustls::AlertDescription as A;
    let Some(alert) = alert_of(e) else {
        return describe(e);
    };
    let meaning = match alert {
        A::UnknownCA => "it does not trust the CA that issued it: is the agent's tls.ca the CA of this listener's certificate?",
        A::BadCertificate => "the certificate does not name the address the agent dialed (its controllers: entry), or is malformed",
        A::CertificateExpired => "the certificate has expired or is not valid yet (or a clock is wrong)",
        A::CertificateRevoked => "the agent's CRL revokes it",
        A::UnsupportedCertificate => "it is not usable for a TLS server (key usage, extended key usage)",
        A::CertificateUnknown => "the agent could not verify it",
        A::AccessDenied => "the agent refuses this controller",
        _ => {
            return format!(
                "the agent ended the handshake with the alert {alert:?} (not about this controller's certificate)"
            )
        }
    };
    format!("the agent refused this controller's certificate (alert {alert:?}): {meaning}")
}

/// `text` without the URLs libraries append to their messages (rustls' `peer closed
/// connection without sending TLS close_notify: https://docs.rs/...`): an admin reads the
/// log for what happened, not for a library's manual.
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("http://").or_else(|| rest.find("https://")) {
        let head = rest[..at].trim_end();
        out.push_str(head.strip_suffix(':').unwrap_or(head).trim_end());
        let end = rest[at..]
            .find(char::is_whitespace)
            .map_or(rest.len(), |n| at + n);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether the first bytes a peer sent are a TLS record (handshake, alert or data, version
/// 3.x): what a plaintext end sees when the other end speaks TLS.
pub fn looks_like_tls(first: &[u8]) -> bool {
    matches!(first, [0x14..=0x17, 0x03, ..])
}

/// The first bytes a connection received, kept for whoever explains its end.
pub type FirstBytes = Arc<std::sync::Mutex<Vec<u8>>>;

/// How many of a connection's first bytes [`Sniff`] keeps.
const SNIFF_BYTES: usize = 8;

/// A stream that records the first bytes read from it in a [`FirstBytes`] and passes
/// everything through: after a failure, they tell "the peer does not speak TLS" (nothing, or
/// not a TLS record) and "the peer speaks TLS and we do not" (a TLS record) from other ends.
pub struct Sniff<S> {
    inner: S,
    first: FirstBytes,
}

impl<S> Sniff<S> {
    pub fn new(inner: S, first: FirstBytes) -> Self {
        Self { inner, first }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sniff<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &r {
            let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            if first.len() < SNIFF_BYTES {
                let new = &buf.filled()[before..];
                let take = new.len().min(SNIFF_BYTES - first.len());
                first.extend_from_slice(&new[..take]);
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sniff<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    // Passed through: tokio's default writes only the first buffer, and rustls' last write
    // after a failed handshake is one vectored write of what it has queued (the
    // ChangeCipherSpec, then the alert that says why): without this, the alert never left
    // and the controller read "tls handshake eof" instead of the agent's reason.
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A TLS alert the peer sent, if that is what `e` is.
pub fn alert_of(e: &std::io::Error) -> Option<rustls::AlertDescription> {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::AlertReceived(a)) => Some(*a),
        _ => None,
    }
}

/// The certificate problem in a handshake error, if that is what `e` is.
pub fn certificate_error(e: &std::io::Error) -> Option<&rustls::CertificateError> {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => Some(c),
        _ => None,
    }
}

/// A point in time as people read it: `2026-12-04 21:10:05 UTC`.
pub fn human_time(unix: i64) -> String {
    rfc3339(unix)
}

/// `check`'s view of the key material: what to print, and what is wrong or close to it.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

/// `check`'s view of the key material: each certificate described, what makes it unusable
/// (expired, not yet valid, not naming `host`) a problem, an expiry within `warn_before` a
/// warning.
pub fn check(paths: &TlsPaths, now: SystemTime, host: &str, warn_before: Duration) -> Report {
    let mut report = Report::default();
    let material = match Material::load(paths) {
        Ok(m) => m,
        Err(e) => {
            report.problems.push(e.to_string());
            return report;
        }
    };
    // Expiry is said per certificate below; what else would make the controller refuse
    // this host (another host's name, another CA) is a problem here, each on its own.
    if let Err(e @ TlsError::WrongHost { .. }) = material.usable_for(host, now, warn_before) {
        report.problems.push(e.to_string());
    }
    let now = unix(now);
    if let Err(e) = material.chains_to_ca(now) {
        report.problems.push(e.to_string());
    }
    let described = material
        .chain
        .iter()
        .map(|c| (&paths.cert, c))
        .chain(material.roots.iter().map(|c| (&paths.ca, c)));
    for (path, der) in described {
        let Some(info) = cert_info(der) else { continue };
        let left = info.not_after - now;
        report.lines.push(format!(
            "{}: subject {:?}; issuer {:?}; SANs [{}]; expires {} ({})",
            path.display(),
            info.subject,
            info.issuer,
            info.sans.join(", "),
            rfc3339(info.not_after),
            if left < 0 {
                "EXPIRED".to_owned()
            } else {
                format!("in {} days", left / 86_400)
            }
        ));
        if left < 0 {
            report.problems.push(format!(
                "{}: certificate {:?} expired on {}",
                path.display(),
                info.subject,
                rfc3339(info.not_after)
            ));
        } else if left < warn_before.as_secs() as i64 {
            report.warnings.push(expiry_warning(path, &info, left));
        }
        if info.not_before > now {
            report.problems.push(format!(
                "{}: certificate {:?} is not valid before {}",
                path.display(),
                info.subject,
                rfc3339(info.not_before)
            ));
        }
    }
    report
}

/// A certificate's date as people read it: `2026-12-04 21:10:05 UTC` (not `...T...Z`).
fn rfc3339(unix: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(unix.max(0) as u64);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} UTC", s.replacen('T', " ", 1).trim_end_matches('Z'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_name_is_the_host_part_of_a_controller_entry() {
        let name = |a: &str| server_name(a).map(|n| n.to_str().into_owned());
        assert_eq!(name("ctl1:6870").as_deref(), Ok("ctl1"));
        assert_eq!(
            name("ctl1.example.org:7000").as_deref(),
            Ok("ctl1.example.org")
        );
        assert_eq!(name("127.0.0.1:6870").as_deref(), Ok("127.0.0.1"));
        assert_eq!(name("[::1]:6870").as_deref(), Ok("::1"));
        assert!(name("bad name:1").is_err());
    }

    #[test]
    fn a_certificate_names_a_host_exactly_or_by_its_short_form_in_a_cluster_domain() {
        let fqdn = vec!["node001.cluster.example".to_owned()];
        let domains = vec!["cluster.example".to_owned()];
        assert!(cert_names_host(&fqdn, "node001", &domains));
        assert!(cert_names_host(&fqdn, "NODE001.cluster.example", &[]));
        assert!(
            !cert_names_host(&fqdn, "node001", &[]),
            "no domain configured"
        );
        assert!(!cert_names_host(&fqdn, "node002", &domains));
        assert!(!cert_names_host(&fqdn, "node001.other.example", &domains));
        assert!(!cert_names_host(&[], "node001", &domains));
        // The red team's certificates: a SAN in another domain speaks for no short name.
        for evil in ["node001.evil", "node001.other.example"] {
            assert!(
                !cert_names_host(&[evil.to_owned()], "node001", &domains),
                "{evil}"
            );
        }
        // A short SAN does not speak for a longer name, nor a prefix for a name.
        assert!(!cert_names_host(
            &["node001".to_owned()],
            "node001.cluster.example",
            &domains
        ));
        assert!(!cert_names_host(
            &["node0011.cluster.example".to_owned()],
            "node001",
            &domains
        ));
        assert!(cert_names_host(&["node001".to_owned()], "Node001", &[]));
    }

    #[test]
    fn library_urls_are_cut_and_dates_are_human() {
        assert_eq!(
            plain("peer closed connection without sending TLS close_notify: https://docs.rs/rustls/latest/rustls/manual/_03_howto/index.html#unexpected-eof"),
            "peer closed connection without sending TLS close_notify"
        );
        assert_eq!(plain("see http://x.y/z for more"), "see for more");
        assert_eq!(plain("nothing to cut"), "nothing to cut");
        assert_eq!(human_time(0), "1970-01-01 00:00:00 UTC");
        assert!(looks_like_tls(&[0x15, 0x03, 0x03, 0x00, 0x02]));
        assert!(looks_like_tls(&[0x16, 0x03, 0x01]));
        assert!(!looks_like_tls(&[0x00, 0x00, 0x00, 0x00]));
        assert!(!looks_like_tls(&[]));
    }

    #[test]
    fn every_failure_has_its_own_label() {
        let labels: std::collections::BTreeSet<_> =
            Failure::ALL.iter().map(|f| f.as_str()).collect();
        assert_eq!(labels.len(), Failure::ALL.len());
        for f in Failure::ALL {
            assert_eq!(Failure::ALL[f.index()], f);
        }
    }
}
