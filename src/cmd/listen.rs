//! `xce-agent listen ADDR`: the reference receiver. Prints what agents send, as lines of
//! text or JSON or as the cluster's table; used by the tests as the fake controller.

use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::{exit, CmdError};
use crate::cli::{ListenBudget, ListenFormat, ListenTls};
use crate::cluster_table::{serve_table, TableView};
use crate::receiver::session::{self, LineFormat, ListenOpts};

/// Where `listen` takes agents: a TCP address (the controller's door) and/or a unix socket
/// (the worker's door).
pub struct Doors<'a> {
    pub addr: Option<&'a str>,
    pub unix: Option<&'a std::path::Path>,
    pub unix_uids: &'a [u32],
}

pub async fn run(
    doors: Doors<'_>,
    format: ListenFormat,
    ack: bool,
    only: &[String],
    refresh: Option<Duration>,
    tls: &ListenTls,
    budget: &ListenBudget,
) -> Result<u8, CmdError> {
    if budget.host_share == 0 || budget.host_share > budget.memory_budget {
        eprintln!(
            "xce-agent: --host-share {} must be within 1 byte and --memory-budget ({})",
            budget.host_share, budget.memory_budget
        );
        return Ok(exit::CONFIG);
    }
    let budget = crate::receiver::budget::Budget::new(
        usize::try_from(budget.memory_budget).unwrap_or(usize::MAX),
        usize::try_from(budget.host_share).unwrap_or(usize::MAX),
    );
    let tls_opts = tls;
    let tls = match (&tls.tls_ca, &tls.tls_cert, &tls.tls_key) {
        (Some(ca), Some(cert), Some(key)) => {
            let paths = crate::config::agent::TlsPaths {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
                crl: tls.tls_crl.clone(),
            };
            let material = crate::link::tls::Material::load(&paths)?;
            Some(material.server_config()?)
        }
        _ if tls.insecure => {
            let addr = doors.addr.unwrap_or("-");
            eprintln!("xce-agent: WARNING: --insecure: accepting plaintext agents; anyone who can reach {addr} can report values for any host");
            None
        }
        _ if doors.addr.is_none() => None,
        _ => {
            eprintln!("xce-agent: refusing to listen in plaintext: give --tls-ca, --tls-cert and --tls-key (agents then need certificates from that CA), or --insecure to accept unauthenticated agents");
            return Ok(exit::CONFIG);
        }
    };
    // A descriptor per agent: the soft limit (often 1024) up to the hard one.
    session::raise_fd_limit();
    let mut listeners = Vec::new();
    if let Some(addr) = doors.addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| CmdError::ListenBind {
                addr: addr.to_owned(),
                source,
            })?;
        eprintln!("xce-agent: listening on {}", listener.local_addr()?);
        listeners.push(listener);
    }
    let mut unix = Vec::new();
    if let Some(path) = doors.unix {
        let allowed_uids = if doors.unix_uids.is_empty() {
            vec![0]
        } else {
            doors.unix_uids.to_vec()
        };
        // Anyone may connect; SO_PEERCRED decides who may speak (a mode cannot say "these
        // uids"). Only root by default.
        let listener =
            crate::status::server::bind_socket(path, None, 0o666).map_err(CmdError::UnixDoor)?;
        let own = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        let host = crate::receiver::identity::canonical_host(&own, &tls_opts.domains);
        eprintln!(
            "xce-agent: listening on {} for uids {allowed_uids:?}, as host {host}",
            path.display()
        );
        unix.push(session::UnixDoor {
            listener,
            allowed_uids,
            host,
        });
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let opts = ListenOpts {
        ack,
        assign: Vec::new(),
        tls,
        handshake_timeout: None,
        domains: tls_opts.domains.clone(),
        hello_timeout: None,
        max_unauthenticated: None,
        budget: Some(budget),
        idle_timeout: None,
    };
    let out = tokio::io::stdout();
    let format = match format {
        ListenFormat::Json => LineFormat::Json,
        ListenFormat::Text => LineFormat::Text,
        ListenFormat::Table => {
            let view = TableView::for_stdout(only, refresh);
            serve_table(listeners, unix, opts, view, out, shutdown).await?;
            return Ok(exit::OK);
        }
    };
    session::serve_lines(listeners, unix, opts, format, out, shutdown).await?;
    Ok(exit::OK)
}

/// SIGTERM or SIGINT ends the receiver (its connections first).
async fn cancel_on_signal(shutdown: CancellationToken) {
    if let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    shutdown.cancel();
}
