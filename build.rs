//! Links the daemon's steady-state code together (link/steady-text.ld; BENCHMARKS.md 23c).
fn main() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("link/steady-text.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!(
            "cargo:rustc-link-arg-bin=xce-agent=-Wl,-T,{}",
            script.display()
        );
    }
}
