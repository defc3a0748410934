//! The Linux kernel NVMe-oF target (nvmet) as typed configfs objects.
//!
//! The tree under `/sys/kernel/config/nvmet` is modelled as a [`State`]:
//! subsystems with their namespaces and allowed hosts, ports with the
//! subsystems linked to them, and hosts. [`Nvmet::read`] reads back what is
//! present; [`Nvmet::apply`] makes only the changes needed for a desired
//! state, in the order the kernel requires, and is idempotent;
//! [`Nvmet::teardown`] removes objects with everything hanging off them.
//! Every name is a checked type ([`Nqn`], [`Nsid`], [`PortId`]), so nothing a
//! caller passes can escape or confuse configfs.
//!
//! The crate knows nothing of volumes: it is a library any Rust tool that
//! drives the kernel target can link. It is synchronous and does no locking;
//! callers serialise changes to the objects they own.
//!
//! # Host
//!
//! configfs mounted at `/sys/kernel/config`, the `nvmet` module loaded (and
//! `nvmet-tcp` or `nvmet-rdma` for ports of that transport), root. No C
//! library and no async runtime. The package is `pillar-csi-nvmet`; the
//! crate is `nvmet`. A fuller walk-through, with teardown, is
//! `examples/nvmet_export.rs`.
//!
//! ```no_run
//! use nvmet::{Namespace, Nqn, Nsid, Nvmet, Port, PortId, State, Subsystem};
//!
//! let target = Nvmet::open()?;
//! let nqn = Nqn::new("nqn.2026-01.org.example:vol1")?;
//! let mut sub = Subsystem { allow_any_host: true, ..Default::default() };
//! sub.namespaces.insert(Nsid::new(1)?, Namespace {
//!     device_path: "/dev/zvol/tank/vol1".into(),
//!     enabled: true,
//!     ..Default::default()
//! });
//! let mut port = Port::tcp("127.0.0.1:4420".parse()?);
//! port.subsystems.insert(nqn.clone());
//! let mut desired = State::default();
//! desired.subsystems.insert(nqn, sub);
//! desired.ports.insert(PortId(1), port);
//! let steps = target.apply(&desired)?;
//! println!("{} changes; a second apply makes none: {:?}", steps.len(), target.apply(&desired)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod model;
mod names;
mod plan;
mod read;
mod revoke;

pub use configfs::Step;
pub use error::Error;
pub use model::{Namespace, Port, State, Subsystem, Teardown, Transport};
pub use names::{InvalidName, Nqn, Nsid, PortId, NQN_MAX_LEN};
pub use plan::{plan_apply, plan_teardown};
pub use revoke::{narrows_access, plan_apply_revoking, RevokingPlan, SubsystemPlan};

use configfs::Tree;
use std::path::PathBuf;

/// The default root of the nvmet configfs tree.
pub const DEFAULT_ROOT: &str = "/sys/kernel/config/nvmet";

/// A handle on the nvmet configfs tree.
#[derive(Debug, Clone)]
pub struct Nvmet {
    tree: Tree,
}

impl Nvmet {
    /// Opens `/sys/kernel/config/nvmet`; fails clearly when configfs is not
    /// mounted or the `nvmet` module is not loaded.
    pub fn open() -> Result<Self, Error> {
        Self::open_at(DEFAULT_ROOT)
    }

    /// Opens the nvmet tree at another root (a configfs mounted elsewhere).
    pub fn open_at(root: impl Into<PathBuf>) -> Result<Self, Error> {
        Ok(Self {
            tree: Tree::open(root)?,
        })
    }

    /// A handle on an already opened tree (for example [`Tree::at`] a copy).
    pub fn with_tree(tree: Tree) -> Self {
        Self { tree }
    }

    /// The handle calling `hook` after every configfs step it runs.
    pub fn with_step_hook(mut self, hook: configfs::StepHook) -> Self {
        self.tree = self.tree.with_step_hook(hook);
        self
    }

    /// The configfs tree this handle writes.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Reads back every subsystem, port and host present.
    pub fn read(&self) -> Result<State, Error> {
        read::read_all(&self.tree)
    }

    /// Reads back only what `desired` names (and the hosts it needs), so the
    /// cost of an apply does not grow with unrelated objects.
    pub fn read_scoped(&self, desired: &State) -> Result<State, Error> {
        read::read_scoped(&self.tree, desired)
    }

    /// Makes the objects named in `desired` match it, changing only what
    /// differs, and returns the steps taken (none when already in place).
    /// Objects `desired` does not name are left alone.
    pub fn apply(&self, desired: &State) -> Result<Vec<Step>, Error> {
        let present = self.read_scoped(desired)?;
        let steps = plan_apply(&present, desired)?;
        self.tree.run(&steps)?;
        Ok(steps)
    }

    /// Removes the named objects and what hangs off them, in the kernel's
    /// order; absent objects are skipped. Returns the steps taken.
    pub fn teardown(&self, teardown: &Teardown) -> Result<Vec<Step>, Error> {
        let present = read::read_for_teardown(&self.tree, teardown)?;
        let steps = plan_teardown(&present, teardown)?;
        self.tree.run(&steps)?;
        Ok(steps)
    }

    /// Tells the target that a namespace's device changed size, so
    /// connected hosts see the new capacity.
    pub fn revalidate_size(&self, nqn: &Nqn, nsid: Nsid) -> Result<(), Error> {
        let path = format!(
            "{}/namespaces/{nsid}/revalidate_size",
            plan::subsystem_dir(nqn)
        );
        self.tree.run(&[Step::write(path, "1")])?;
        Ok(())
    }
}
