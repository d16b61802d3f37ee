//! `xce-agent tls init|issue`: a cluster CA for sites without a PKI ([`crate::tls_ca`]).

use super::{exit, CmdError};
use crate::cli::TlsCommand;

/// Prints every file written.
pub fn run(command: &TlsCommand) -> Result<u8, CmdError> {
    let written = match command {
        TlsCommand::Init { dir, days } => crate::tls_ca::init(dir, *days)?,
        TlsCommand::Issue {
            ca,
            out,
            domain,
            days,
            names,
        } => crate::tls_ca::issue(ca, out, names, domain.as_deref(), *days)?,
    };
    for path in written {
        println!("{}", path.display());
    }
    Ok(exit::OK)
}
