//! Generates the FFI from the installed OpenZFS headers (Debian's
//! `libzfslinux-dev`, OpenZFS 2.2 or later), found and linked through
//! pkg-config. Anything missing stops the build with one line naming the
//! Debian package that provides it.
//!
//! Only the functions the safe API in `sys::zfs` needs are bound: init/fini
//! of both libraries, dataset create/destroy/exists/snapshot/clone and the
//! encryption key calls through libzfs_core, dataset and pool handles and their properties through libzfs,
//! a filesystem's mount and unmount,
//! child and snapshot iteration, the property tables, the version strings and
//! the nvlist calls to build and read property lists.
use std::{env, path::PathBuf};

/// Functions bound, as bindgen allowlist patterns.
const FUNCTIONS: &[&str] = &[
    // libzfs_core: thread-safe, one ioctl each.
    "libzfs_core_init",
    "libzfs_core_fini",
    "lzc_create",
    "lzc_destroy",
    "lzc_exists",
    "lzc_snapshot",
    "lzc_clone",
    "lzc_destroy_snaps",
    // Native encryption: a volume's raw wrapping key, loaded, unloaded, changed.
    "lzc_load_key",
    "lzc_unload_key",
    "lzc_change_key",
    // libzfs: one handle, not thread-safe.
    "libzfs_init",
    "libzfs_fini",
    "libzfs_print_on_error",
    "libzfs_errno",
    "libzfs_error_description",
    "libzfs_error_action",
    "zfs_open",
    "zfs_close",
    "zfs_get_type",
    "zfs_get_name",
    "zfs_prop_get",
    "zfs_prop_get_int",
    "zfs_prop_get_numeric",
    "zfs_prop_set",
    "zfs_prop_set_list",
    "zfs_prop_inherit",
    "zfs_get_user_props",
    "zfs_iter_filesystems_v2",
    "zfs_iter_snapshots_v2",
    // Filesystems: mounted where their `mountpoint` says, as `zfs mount` does.
    "zfs_mount",
    "zfs_unmount",
    "zpool_open",
    "zpool_close",
    "zpool_get_prop_int",
    "zvol_volsize_to_reservation",
    "zfs_version_userland",
    // The property tables (libzfs's zcommon): names, types, indexes, defaults.
    "zfs_name_to_prop",
    "zfs_prop_to_name",
    "zfs_prop_get_type",
    "zfs_prop_readonly",
    "zfs_prop_setonce",
    "zfs_prop_user",
    "zfs_prop_valid_for_type",
    "zfs_prop_string_to_index",
    "zfs_prop_index_to_string",
    "zfs_prop_default_numeric",
    "zfs_nicestrtonum",
    // libnvpair: build property lists and read them back.
    "nvlist_alloc",
    "nvlist_free",
    "nvlist_add_uint64",
    "nvlist_add_string",
    "nvlist_add_boolean",
    "nvlist_next_nvpair",
    "nvpair_name",
    "nvpair_type",
    "nvpair_value_int32",
    "nvpair_value_string",
    "nvpair_value_nvlist",
    // The statistics ioctl's packed property list, read without libzfs.
    "nvlist_unpack",
    "nvlist_lookup_nvlist",
    "nvlist_lookup_uint64",
    // sys's tests pack lists as the kernel does, to read them back.
    "nvlist_add_nvlist",
    "nvlist_pack",
];

/// Types and constants bound besides those the functions pull in.
const TYPES: &[&str] = &[
    "zfs_type_t",
    "zfs_prop_t",
    "zpool_prop_t",
    "zprop_type_t",
    "zprop_source_t",
    "data_type_t",
    "lzc_dataset_type",
    "zfs_error_t",
    // The ioctl numbers (`ZFS_IOC_OBJSET_STATS`).
    "zfs_ioc_t",
];
const VARS: &[&str] = &[
    "ZFS_MAX_DATASET_NAME_LEN",
    "ZFS_MAXPROPLEN",
    "NV_UNIQUE_NAME",
    "ZFS_ITER_.*",
];

/// The oldest OpenZFS whose libzfs has every function above (the `_v2`
/// iterators came with 2.2).
const MIN_OPENZFS: &str = "2.2";

/// Stops the build with what is missing and the Debian package to install.
fn missing(what: &str, package: &str, detail: impl std::fmt::Display) -> ! {
    eprintln!("error: {what}: install the Debian package {package}\n  ({detail})");
    std::process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let libs = ["libzfs", "libzfs_core"];
    let mut include_paths = Vec::new();
    for lib in libs {
        let found = pkg_config::Config::new()
            .atleast_version(MIN_OPENZFS)
            .probe(lib)
            .unwrap_or_else(|e| match e {
                pkg_config::Error::Command { .. } => {
                    missing("pkg-config cannot run", "pkg-config", e)
                }
                _ => missing(
                    &format!("{lib}.pc of OpenZFS {MIN_OPENZFS} or later not found"),
                    "libzfslinux-dev (bookworm-backports or later)",
                    e,
                ),
            });
        include_paths.extend(found.include_paths);
    }
    // bindgen parses the headers with libclang; without it bindgen panics.
    if let Err(e) = clang_sys::load() {
        missing("libclang (for bindgen) not found", "libclang-dev", e);
    }
    // libnvpair has no .pc file: libzfs's flags carry -lnvpair; link it
    // explicitly too, in case a distribution's libzfs.pc does not.
    println!("cargo:rustc-link-lib=nvpair");

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        // libzfs.h's libspl headers use struct stat64.
        .clang_arg("-D_GNU_SOURCE")
        .clang_arg("-D_LARGEFILE64_SOURCE")
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for p in &include_paths {
        builder = builder.clang_arg(format!("-I{}", p.display()));
    }
    for f in FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    for t in TYPES {
        builder = builder.allowlist_type(t);
    }
    for v in VARS {
        builder = builder.allowlist_var(v);
    }
    let bindings = builder
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on the OpenZFS headers: {e}"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .unwrap_or_else(|e| panic!("cannot write bindings: {e}"));
}
