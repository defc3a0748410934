//! LVM through liblvm2cmd, in-process: no `lvcreate` or `lvs` processes.
//!
//! liblvm2cmd runs LVM's own commands inside the calling process and hands
//! their output to a log callback. It is not thread-safe, so an [`Lvm`]
//! service owns the library's one handle on one worker thread; any number of
//! threads send it typed [`Request`]s over a channel and get typed
//! [`Reply`]s back, one request at a time. Reports are requested as JSON in
//! bytes and parsed into [`Vg`] and [`Lv`]. Every command line is built
//! from checked names ([`VgName`], [`LvName`], [`LvmUuid`]) and numbers, so
//! nothing a caller passes can become an LVM option.
//!
//! Dropping the service stops the worker, which releases the handle with
//! `lvm2_exit` before the process goes on. Only one service may run in a
//! process at a time ([`Error::AlreadyRunning`]), and not beside a
//! [`floor::RawLvm`], the bare call benchmarks time as the floor.
//!
//! ```no_run
//! use sys::lvm::{classify, Lvm, LvName, VgName};
//!
//! let lvm = Lvm::start()?;
//! let vg = VgName::new("data-vg")?;
//! let pool = LvName::new("thin0")?;
//! let new = lvm.create_thin(&vg, &pool, &LvName::new("pvc-1")?, 1 << 30)?;
//! println!("{} is {} bytes at {}", new.uuid, new.size, new.path.display());
//! let lv = lvm.lv(&vg, &new.name)?;
//! assert_eq!(classify(&lv, Some(&pool)), Ok(sys::lvm::Adoptable::Thin));
//! lvm.extend(&vg, &LvName::new("pvc-1")?, 2 << 30)?;
//! lvm.remove(&vg, &new.name, &new.uuid)?;
//! println!("{} bytes free", lvm.vg(&vg)?.free);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod adopt;
mod dm;
mod error;
mod ffi;
pub mod floor;
mod report;
mod worker;

pub use adopt::{classify, Adoptable, Refusal};
pub use api::names::lvm::{
    check_name, InvalidName, InvalidUuid, LvName, LvmUuid, NameKind, NameRule, VgName, MAX_NAME_LEN,
};
pub use error::Error;
pub use report::{
    parse_lvs, parse_vgs, Lv, LvAttr, ReportError, Vg, VolumeType, LV_FIELDS, VG_FIELDS,
};

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
};

/// A request to the LVM worker. Every field is a checked value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Report one VG ([`Reply::Vg`]).
    Vg(VgName),
    /// Report every LV of a VG, internal ones included ([`Reply::Lvs`]).
    Lvs(VgName),
    /// Report one LV ([`Reply::Lv`]).
    Lv(VgName, LvName),
    /// Create a linear LV of at least `size` bytes ([`Reply::Created`]).
    CreateLinear {
        /// The VG.
        vg: VgName,
        /// The new LV.
        lv: LvName,
        /// Bytes, rounded up by LVM to whole extents.
        size: u64,
    },
    /// Create a thin LV of `size` virtual bytes in a thin pool ([`Reply::Created`]).
    CreateThin {
        /// The VG.
        vg: VgName,
        /// The thin pool.
        pool: LvName,
        /// The new LV.
        lv: LvName,
        /// Virtual bytes, rounded up by LVM to whole extents.
        size: u64,
    },
    /// Create a thin snapshot of a thin LV ([`Reply::Created`]): the same
    /// virtual size, blocks shared in the pool until either side writes.
    CreateThinSnapshot {
        /// The VG.
        vg: VgName,
        /// The thin LV (or thin snapshot) to snapshot.
        origin: LvName,
        /// The new LV.
        lv: LvName,
        /// Activate it now (a volume); otherwise it carries LVM's
        /// activation-skip flag, as thin snapshots do by default.
        active: bool,
    },
    /// Remove an LV only if its UUID is `uuid` ([`Reply::Removed`]).
    Remove {
        /// The VG.
        vg: VgName,
        /// The LV.
        lv: LvName,
        /// The UUID it must still have.
        uuid: LvmUuid,
    },
    /// Grow an LV to at least `size` bytes; never shrinks ([`Reply::Lv`]).
    Extend {
        /// The VG.
        vg: VgName,
        /// The LV.
        lv: LvName,
        /// The new size in bytes.
        size: u64,
    },
    /// Report a thin pool's capacity ([`Reply::ThinPool`]).
    ThinPool(VgName, LvName),
}

/// The worker's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A VG.
    Vg(Vg),
    /// The LVs of a VG.
    Lvs(Vec<Lv>),
    /// One LV, as it is after the request.
    Lv(Lv),
    /// The LV just created.
    Created(Created),
    /// The LV was removed.
    Removed,
    /// A thin pool's capacity.
    ThinPool(ThinPool),
}

/// An LV just created: its identity, size and device.
///
/// Read from the kernel's device-mapper entry of the new (active) LV in
/// sysfs, which costs a few small reads; only when the LV did not come up
/// active does the worker run an LVM report instead. [`Lvm::lv`] gives the
/// full report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// Its VG.
    pub vg: VgName,
    /// Its name.
    pub name: LvName,
    /// Its VG's UUID.
    pub vg_uuid: LvmUuid,
    /// Its UUID: pin it for later destructive steps ([`Lvm::remove`]).
    pub uuid: LvmUuid,
    /// Its size in bytes (rounded up to whole extents).
    pub size: u64,
    /// `/dev/<vg>/<lv>`.
    pub path: std::path::PathBuf,
    /// Whether it is active (its device exists).
    pub active: bool,
}

/// A thin pool and its capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct ThinPool {
    /// The pool LV as reported.
    pub lv: Lv,
    /// Data space in bytes.
    pub size: u64,
    /// Data space used in bytes (from `data_percent`, so to LVM's 0.01 %).
    pub used: u64,
    /// Data space used, in percent.
    pub data_percent: f64,
    /// Metadata space used, in percent.
    pub metadata_percent: f64,
}

type Job = (Request, mpsc::Sender<Result<Reply, Error>>);

/// Set while a worker (or a [`floor::RawLvm`]) holds the process's
/// liblvm2cmd handle.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// The process's one claim on liblvm2cmd: taken before a handle is
/// created, given back when dropped (after the handle is released).
pub(crate) struct Claim(());

impl Claim {
    /// Takes the claim; [`Error::AlreadyRunning`] while another holds it.
    pub(crate) fn take() -> Result<Self, Error> {
        RUNNING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| Self(()))
            .map_err(|_| Error::AlreadyRunning)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

/// The LVM service: one worker thread owning the liblvm2cmd handle.
/// `Send + Sync`: share it by reference or in an [`Arc`].
pub struct Lvm {
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Lvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lvm").finish_non_exhaustive()
    }
}

impl Lvm {
    /// Starts the worker and initialises liblvm2cmd on it.
    pub fn start() -> Result<Self, Error> {
        let claim = Claim::take()?;
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), Error>>();
        let spawned = thread::Builder::new()
            .name("lvm-worker".into())
            .spawn(move || {
                worker::run(inbox, ready_tx);
                // Given back once the worker has released the handle.
                drop(claim);
            });
        // A thread that could not be spawned dropped its closure, claim too.
        let worker = spawned.map_err(|e| Error::Worker(format!("cannot spawn it: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                jobs: Some(jobs),
                worker: Some(worker),
            }),
            Ok(Err(e)) => {
                let _ = worker.join();
                Err(e)
            }
            Err(_) => {
                let _ = worker.join();
                Err(Error::Worker("it ended while starting".into()))
            }
        }
    }

    /// Starts the service in an [`Arc`], for sharing with other threads.
    pub fn start_shared() -> Result<Arc<Self>, Error> {
        Self::start().map(Arc::new)
    }

    /// Sends one request to the worker and waits for its reply.
    pub fn call(&self, request: Request) -> Result<Reply, Error> {
        let (tx, rx) = mpsc::channel();
        let gone = || Error::Worker("it stopped before answering".into());
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send((request, tx))
            .map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }

    /// The VG's identity and capacity (size, free bytes, extent size).
    pub fn vg(&self, vg: &VgName) -> Result<Vg, Error> {
        match self.call(Request::Vg(vg.clone()))? {
            Reply::Vg(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    /// Every LV of the VG, internal (hidden) ones included.
    pub fn lvs(&self, vg: &VgName) -> Result<Vec<Lv>, Error> {
        match self.call(Request::Lvs(vg.clone()))? {
            Reply::Lvs(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    /// One LV; [`Error::LvNotFound`] or [`Error::VgNotFound`] when absent.
    pub fn lv(&self, vg: &VgName, lv: &LvName) -> Result<Lv, Error> {
        lv_reply(self.call(Request::Lv(vg.clone(), lv.clone()))?)
    }

    /// Creates a linear LV of `size` bytes (rounded up to whole extents).
    pub fn create_linear(&self, vg: &VgName, lv: &LvName, size: u64) -> Result<Created, Error> {
        created_reply(self.call(Request::CreateLinear {
            vg: vg.clone(),
            lv: lv.clone(),
            size,
        })?)
    }

    /// Creates a thin LV of `size` virtual bytes in the thin pool `pool`.
    pub fn create_thin(
        &self,
        vg: &VgName,
        pool: &LvName,
        lv: &LvName,
        size: u64,
    ) -> Result<Created, Error> {
        created_reply(self.call(Request::CreateThin {
            vg: vg.clone(),
            pool: pool.clone(),
            lv: lv.clone(),
            size,
        })?)
    }

    /// Removes the LV if and only if its UUID is still `uuid`; otherwise
    /// [`Error::UuidMismatch`] and nothing is changed.
    pub fn remove(&self, vg: &VgName, lv: &LvName, uuid: &LvmUuid) -> Result<(), Error> {
        match self.call(Request::Remove {
            vg: vg.clone(),
            lv: lv.clone(),
            uuid: uuid.clone(),
        })? {
            Reply::Removed => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Creates the thin snapshot `lv` of the thin LV `origin`; `active`
    /// activates it (a volume made from a snapshot), otherwise it is left
    /// inactive with the activation-skip flag (a snapshot kept as it is).
    pub fn create_thin_snapshot(
        &self,
        vg: &VgName,
        origin: &LvName,
        lv: &LvName,
        active: bool,
    ) -> Result<Created, Error> {
        created_reply(self.call(Request::CreateThinSnapshot {
            vg: vg.clone(),
            origin: origin.clone(),
            lv: lv.clone(),
            active,
        })?)
    }

    /// Grows the LV to at least `size` bytes; a smaller size is
    /// [`Error::Shrink`], the same size changes nothing.
    pub fn extend(&self, vg: &VgName, lv: &LvName, size: u64) -> Result<Lv, Error> {
        lv_reply(self.call(Request::Extend {
            vg: vg.clone(),
            lv: lv.clone(),
            size,
        })?)
    }

    /// The thin pool's size and use; [`Error::NotAThinPool`] for another LV.
    pub fn thin_pool(&self, vg: &VgName, pool: &LvName) -> Result<ThinPool, Error> {
        match self.call(Request::ThinPool(vg.clone(), pool.clone()))? {
            Reply::ThinPool(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }
}

impl Drop for Lvm {
    fn drop(&mut self) {
        // Closing the channel ends the worker's loop; it then releases the
        // handle (lvm2_exit) before this returns.
        drop(self.jobs.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

fn lv_reply(reply: Reply) -> Result<Lv, Error> {
    match reply {
        Reply::Lv(lv) => Ok(lv),
        other => Err(unexpected(other)),
    }
}

fn created_reply(reply: Reply) -> Result<Created, Error> {
    match reply {
        Reply::Created(c) => Ok(c),
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: Reply) -> Error {
    Error::Worker(format!("unexpected reply {reply:?}"))
}
