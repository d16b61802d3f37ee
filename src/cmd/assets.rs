//! `xce-agent generate-assets DIR` (hidden, for packaging): the man pages and completions.

use std::path::Path;

use super::{exit, CmdError};

/// Prints every file written.
pub fn run(dir: &Path) -> Result<u8, CmdError> {
    let written = crate::cli::generate_assets(dir).map_err(|source| CmdError::Assets {
        dir: dir.to_owned(),
        source,
    })?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(exit::OK)
}
