//! What a frame may carry. Work, memory and log lines per frame are bounded by what the peer
//! declared (a host's resvals by its hello), never by what a list header claims: a 72-byte
//! frame can announce a million zero-sized structs. The same limits are written in
//! docs/protocol.md for the C controller.

/// Most resource instances one hello may declare. A node with ten thousand dynamic resources
/// is a configuration error; the bound keeps a hostile hello's decoded size near 1 MiB.
pub const MAX_DECLARED: u32 = 10_000;

/// Most (name, instance) pairs one welcome may assign: every assigned instance is declared in
/// the agent's next hello, so the hello's bound applies.
pub const MAX_ASSIGNED: u32 = MAX_DECLARED;

/// Largest frame read before a connection's hello is accepted (the whole framed message,
/// segment table included): a hello declaring the protocol's [`MAX_DECLARED`] instances,
/// each a `Declared` struct (4 words), its resource name at the name rule's 39 bytes (5
/// words with the NUL) and an instance name of up to 128 bytes (17 words), is 10,000 * 208 =
/// 2,080,000 bytes, plus the host and free-text fields (under 2 KiB). A connection not yet
/// authenticated then holds at most 2 MiB for its next frame, not the 8 MiB any frame may
/// have once its hello is in. An agent's real hello is a few KiB.
pub const MAX_HELLO_FRAME_BYTES: usize = 2 << 20;

/// Longest free-text hello field (agentVersion, bootId, configDigest): ours are under 64.
pub const MAX_HELLO_TEXT: usize = 256;

/// Longest list of each kind an agent's frame may carry, given what it declared. (A
/// welcome's list is bounded by `MAX_ASSIGNED` alone.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Resvals in one batch: the instances the connection's hello declared.
    pub resvals: u32,
    /// Declared instances in one hello.
    pub declared: u32,
}

impl FrameLimits {
    /// What an agent may send once its hello declared `declared` instances.
    pub fn after_hello(declared: usize) -> Self {
        Self {
            resvals: u32::try_from(declared)
                .unwrap_or(u32::MAX)
                .min(MAX_DECLARED),
            ..Self::default()
        }
    }
}

impl Default for FrameLimits {
    /// The protocol's absolute bounds: no batch longer than a hello may declare.
    fn default() -> Self {
        Self {
            resvals: MAX_DECLARED,
            declared: MAX_DECLARED,
        }
    }
}
