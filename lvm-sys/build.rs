//! Generates the bindings over `lvm2cmd.h` (Debian's `liblvm2-dev`, which
//! ships no pkg-config file) and links liblvm2cmd. Anything missing stops
//! the build with one line naming the Debian package that provides it.
use std::{env, path::PathBuf};

/// Stops the build with what is missing and the Debian package to install.
fn missing(what: &str, package: &str, detail: impl std::fmt::Display) -> ! {
    eprintln!("error: {what}: install the Debian package {package}\n  ({detail})");
    std::process::exit(1);
}

fn main() {
    let header = env::var("LVM2CMD_HEADER").unwrap_or_else(|_| "/usr/include/lvm2cmd.h".into());
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-env-changed=LVM2CMD_HEADER");
    if !PathBuf::from(&header).is_file() {
        missing(
            &format!("{header} not found"),
            "liblvm2-dev",
            "or point LVM2CMD_HEADER at lvm2cmd.h",
        );
    }
    // bindgen parses the header with libclang; without it bindgen panics.
    if let Err(e) = clang_sys::load() {
        missing("libclang (for bindgen) not found", "libclang-dev", e);
    }
    println!("cargo:rustc-link-lib=dylib=lvm2cmd");

    let bindings = bindgen::Builder::default()
        .header(&header)
        .allowlist_function("lvm2_.*")
        .allowlist_type("lvm2_.*")
        .allowlist_var("LVM2_.*")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| missing(&format!("bindgen failed on {header}"), "liblvm2-dev", e));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join("bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        eprintln!("error: cannot write {}: {e}", out.display());
        std::process::exit(1);
    }
}
