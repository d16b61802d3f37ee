//! TODO
pub mod builtin;
