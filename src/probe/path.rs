//! The one PATH every probe gets: its environment is cleared, so nothing of the agent's leaks
//! in. The child engine sets it (`child/`), a bare command name is looked up on it
//! (`resolve.rs`), and the script rule follows `env NAME` and program text on it
//! (`security.rs`): below all three.

/// The fixed PATH probes get.
pub const PROBE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
