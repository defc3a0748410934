//! Generates the bindings over `lvm2cmd.h` (package liblvm2-dev) and links
//! liblvm2cmd.
use std::{env, path::PathBuf};

fn main() {
    let header = env::var("LVM2CMD_HEADER").unwrap_or_else(|_| "/usr/include/lvm2cmd.h".into());
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-env-changed=LVM2CMD_HEADER");
    println!("cargo:rustc-link-lib=dylib=lvm2cmd");

    let bindings = match bindgen::Builder::default()
        .header(&header)
        .allowlist_function("lvm2_.*")
        .allowlist_type("lvm2_.*")
        .allowlist_var("LVM2_.*")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
    {
        Ok(b) => b,
        Err(e) => {
            eprintln!("bindgen failed on {header} (install liblvm2-dev and libclang-dev): {e}");
            std::process::exit(1);
        }
    };
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join("bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        eprintln!("cannot write {}: {e}", out.display());
        std::process::exit(1);
    }
}
