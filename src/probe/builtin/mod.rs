//! Built-in load indices (LSF's 11 plus modern extras), computed by one shared sampler.
