//! Bench parameters from the environment (`SECS=20 cargo bench --bench NAME`).

/// The value of the environment variable `key`, or `default` when it is unset. A value that
/// does not parse stops the bench: a typo must not be measured as the default.
pub fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{key}={text:?}: not a {}", std::any::type_name::<T>())),
        Err(_) => default,
    }
}
