//! Safe primitives over a Linux configfs tree, shared by the `nvmet` and `lio`
//! crates.
//!
//! configfs is a kernel filesystem where creating a directory creates a kernel
//! object, writing a file sets one of its attributes and a symlink connects two
//! objects. This crate gives three things on top of that:
//!
//! - [`Component`]: one path component that cannot escape or confuse the tree
//!   (no `/`, NUL, whitespace or control characters, not `.` or `..`, bounded
//!   length). Every name a caller supplies goes through it.
//! - [`Step`] and [`Tree::run`]: a plan of mkdir / write / symlink / unlink /
//!   rmdir steps, relative to a root, executed in order once every path in it
//!   is checked, each step looked up from the root opened once. Object crates
//!   compute a plan from the difference between desired and present state;
//!   the plan is a plain value, so its ordering is unit-testable without a
//!   kernel.
//! - [`Tree`] readers: attributes and child listings, with errors that carry
//!   the path and the errno; and [`Folder`], a folder held open so that
//!   reading many objects looks each file up from its own folder instead of
//!   walking the whole path from `/` every time.
//!
//! # Host
//!
//! configfs mounted at `/sys/kernel/config` and the kernel module of the
//! subsystem written (nvmet, target_core_mod, ...) loaded; writing needs
//! root. No C library and no async runtime. The package is
//! `pillar-csi-configfs`; the crate is `configfs`. A fuller walk-through is
//! `examples/configfs_tree.rs`.
//!
//! ```no_run
//! use configfs::{Component, Step, Tree};
//!
//! let tree = Tree::open("/sys/kernel/config/nvmet")?;
//! let name = Component::new("nqn.2014-08.org.example:vol1", 223)?;
//! let dir = format!("subsystems/{name}");
//! tree.run(&[
//!     Step::mkdir(&dir),
//!     Step::write(format!("{dir}/attr_allow_any_host"), "1"),
//! ])?;
//! println!("{:?}", tree.read_attr(&format!("{dir}/attr_model"))?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod component;
mod error;
mod folder;
mod tree;

pub use component::{Component, NameError};
pub use error::{Error, StepKind};
pub use folder::Folder;
pub use tree::{Step, StepHook, Tree};
