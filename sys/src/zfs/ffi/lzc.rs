//! libzfs_core: the thread-safe calls (create, destroy, snapshot, clone,
//! exists) on its global `/dev/zfs` descriptor.
use super::*;

/// A reference on libzfs_core, released on drop, and a `/dev/zfs`
/// descriptor of our own for the statistics ioctl, which libzfs_core does
/// not offer.
#[derive(Debug)]
pub(crate) struct Lzc {
    dev: OwnedFd,
}

/// `ZFS_IOC_OBJSET_STATS`.
const OBJSET_STATS: rustix::ioctl::Opcode = z::ZFS_IOC_OBJSET_STATS as rustix::ioctl::Opcode;

/// The property list's first buffer: a zvol's packs to about 4 KiB; the
/// kernel says how much it needs when a list does not fit.
const STATS_BUFFER: usize = 16 << 10;

/// The kernel's `zfs_cmd_t` (include/sys/zfs_ioctl.h, a header libzfs's
/// development files do not install): the fields the statistics ioctl
/// uses, in the places they have kept on Linux since ZFS on Linux 0.7, then
/// zeroes up to a size well above the whole structure (about 13.7 KiB in
/// OpenZFS 2.3), which the kernel copies in and out. [`Lzc::fast_stats`]
/// checks the place of `zc_objset_stats` against the property list once
/// per process (see `Zfs::volume_guid`).
#[repr(C)]
struct ZfsCmd {
    name: [u8; 4096],
    nvlist_src: u64,
    nvlist_src_size: u64,
    nvlist_dst: u64,
    nvlist_dst_size: u64,
    nvlist_dst_filled: u32,
    pad2: u32,
    /// `zc_history`, `zc_value[MAXPATHLEN * 2]`, `zc_string[MAXNAMELEN]`,
    /// ten `uint64_t` (`zc_guid` to `zc_iflags`) and `zfs_share_t` (four).
    legacy: [u8; LEGACY],
    objset_stats: ObjsetStats,
    rest: [u8; (32 << 10) - STATS_AT - std::mem::size_of::<ObjsetStats>()],
}

/// The bytes between `zc_pad2` and `zc_objset_stats`.
const LEGACY: usize = 8 + 8192 + 256 + 10 * 8 + 4 * 8;
/// Where `zc_objset_stats` starts.
const STATS_AT: usize = 4136 + LEGACY;

const _: () = assert!(std::mem::offset_of!(ZfsCmd, objset_stats) == STATS_AT);
const _: () = assert!(STATS_AT == 12704);

/// The head of the kernel's `dmu_objset_stats_t` (its origin name follows,
/// in [`ZfsCmd::rest`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct ObjsetStats {
    num_clones: u64,
    creation_txg: u64,
    guid: u64,
    kind: u32,
    is_snapshot: u8,
    inconsistent: u8,
    redacted: u8,
    pad: u8,
}

/// The kernel's `DMU_OST_ZVOL`.
const OBJSET_ZVOL: u32 = 3;

/// What the statistics ioctl reports of a dataset without its property
/// list: no property is gathered or packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FastStats {
    /// The dataset's GUID.
    pub guid: u64,
    /// Whether it is a volume.
    pub zvol: bool,
}

impl ZfsCmd {
    /// A command naming `name`, every other field zero.
    fn named(name: &CStr) -> Result<Box<Self>, c_int> {
        let bytes = name.to_bytes_with_nul();
        let mut cmd = Box::new(ZfsCmd {
            name: [0; 4096],
            nvlist_src: 0,
            nvlist_src_size: 0,
            nvlist_dst: 0,
            nvlist_dst_size: 0,
            nvlist_dst_filled: 0,
            pad2: 0,
            legacy: [0; LEGACY],
            objset_stats: ObjsetStats {
                num_clones: 0,
                creation_txg: 0,
                guid: 0,
                kind: 0,
                is_snapshot: 0,
                inconsistent: 0,
                redacted: 0,
                pad: 0,
            },
            rest: [0; (32 << 10) - STATS_AT - std::mem::size_of::<ObjsetStats>()],
        });
        if bytes.len() > cmd.name.len() {
            return Err(ENAMETOOLONG);
        }
        cmd.name[..bytes.len()].copy_from_slice(bytes);
        Ok(cmd)
    }
}

impl Lzc {
    /// `libzfs_core_init` (opens `/dev/zfs` once per process, counted) and
    /// our own descriptor on `/dev/zfs`.
    pub fn init() -> Result<Self, c_int> {
        let dev = rustix::fs::open(
            "/dev/zfs",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| e.raw_os_error())?;
        // SAFETY: libzfs_core_init takes no arguments, is thread-safe and
        // reference-counted; each success is paired with one fini in Drop.
        let rc = unsafe { z::libzfs_core_init() };
        if rc == 0 {
            Ok(Lzc { dev })
        } else {
            Err(rc)
        }
    }

    /// The statistics ioctl (`ZFS_IOC_OBJSET_STATS`) with the property list
    /// copied into `buffer` (grown when the kernel needs more); the packed
    /// list's length. The kernel work under every property read, with
    /// nothing unpacked.
    pub fn stats_packed(&self, name: &CStr, buffer: &mut Vec<u8>) -> Result<usize, c_int> {
        let mut cmd = ZfsCmd::named(name)?;
        if buffer.len() < STATS_BUFFER {
            buffer.resize(STATS_BUFFER, 0);
        }
        loop {
            cmd.nvlist_dst = buffer.as_mut_ptr() as u64;
            cmd.nvlist_dst_size = buffer.len() as u64;
            let rc = self.objset_stats(&mut cmd);
            match rc {
                Ok(()) => return Ok(cmd.nvlist_dst_size as usize),
                // The kernel wrote the size it needs.
                Err(e)
                    if e == rustix::io::Errno::NOMEM
                        && cmd.nvlist_dst_size as usize > buffer.len() =>
                {
                    buffer.resize(cmd.nvlist_dst_size as usize, 0);
                }
                Err(e) => return Err(e.raw_os_error()),
            }
        }
    }

    /// The statistics ioctl without a property list: the kernel fills in
    /// only the dataset's fast statistics (`dmu_objset_fast_stat`).
    pub fn fast_stats(&self, name: &CStr) -> Result<FastStats, c_int> {
        let mut cmd = ZfsCmd::named(name)?;
        self.objset_stats(&mut cmd).map_err(|e| e.raw_os_error())?;
        Ok(FastStats {
            guid: cmd.objset_stats.guid,
            zvol: cmd.objset_stats.kind == OBJSET_ZVOL,
        })
    }

    /// `ZFS_IOC_OBJSET_STATS` on `cmd`; a property list is copied out only
    /// where `cmd.nvlist_dst` points at a buffer.
    fn objset_stats(&self, cmd: &mut ZfsCmd) -> rustix::io::Result<()> {
        // SAFETY: `cmd` is larger than the kernel's zfs_cmd_t and laid out
        // as its first fields; `nvlist_dst` is either 0 (no list) or the
        // caller's buffer, live and writable for `nvlist_dst_size` bytes
        // for the whole call.
        unsafe {
            rustix::ioctl::ioctl(
                &self.dev,
                rustix::ioctl::Updater::<OBJSET_STATS, ZfsCmd>::new(cmd),
            )
        }
    }

    /// `lzc_create` of a volume (or filesystem) with kernel-form
    /// properties and, for an encrypted one, its raw wrapping key.
    pub fn create(
        &self,
        name: &CStr,
        zvol: bool,
        props: &NvList,
        key: Option<&mut [u8; KEY_LEN]>,
    ) -> Result<(), c_int> {
        let kind = if zvol {
            z::LZC_DATSET_TYPE_ZVOL
        } else {
            z::LZC_DATSET_TYPE_ZFS
        };
        let (key, len) = key_arg(key);
        // SAFETY: name is NUL-terminated; props is a live nvlist that
        // lzc_create only reads (it copies it into the ioctl's arguments);
        // the key is NULL with length 0 or a live buffer of `len` bytes
        // that lzc_create only copies.
        errno(unsafe { z::lzc_create(name.as_ptr(), kind, props.as_ptr(), key, len) })
    }

    /// `lzc_load_key` of `name`'s raw wrapping key; `noop` only checks it
    /// (the key stays unloaded).
    pub fn load_key(&self, name: &CStr, noop: bool, key: &mut [u8; KEY_LEN]) -> Result<(), c_int> {
        let noop = if noop { z::B_TRUE } else { z::B_FALSE };
        let (key, len) = key_arg(Some(key));
        // SAFETY: name is NUL-terminated; the key is a live buffer of
        // `len` bytes that lzc_load_key only copies.
        errno(unsafe { z::lzc_load_key(name.as_ptr(), noop, key, len) })
    }

    /// `lzc_unload_key` of `name`.
    pub fn unload_key(&self, name: &CStr) -> Result<(), c_int> {
        // SAFETY: name is NUL-terminated and only read.
        errno(unsafe { z::lzc_unload_key(name.as_ptr()) })
    }

    /// `lzc_change_key` of `name` to a new raw wrapping key, with `props`
    /// (kernel form) naming its format and location.
    pub fn change_key(
        &self,
        name: &CStr,
        props: &NvList,
        key: &mut [u8; KEY_LEN],
    ) -> Result<(), c_int> {
        let (key, len) = key_arg(Some(key));
        // SAFETY: name is NUL-terminated; props is a live nvlist only
        // read; the key is a live buffer of `len` bytes only copied.
        errno(unsafe {
            z::lzc_change_key(name.as_ptr(), DCP_CMD_NEW_KEY, props.as_ptr(), key, len)
        })
    }

    /// `lzc_destroy` of a filesystem or volume (never recursive).
    pub fn destroy(&self, name: &CStr) -> Result<(), c_int> {
        // SAFETY: name is NUL-terminated and only read.
        errno(unsafe { z::lzc_destroy(name.as_ptr()) })
    }

    /// `lzc_exists`.
    pub fn exists(&self, name: &CStr) -> bool {
        // SAFETY: name is NUL-terminated and only read.
        unsafe { z::lzc_exists(name.as_ptr()) != z::B_FALSE }
    }

    /// `lzc_snapshot` of the snapshots named as keys of `snaps`; on failure
    /// the errno and the per-snapshot errors.
    pub fn snapshot(
        &self,
        snaps: &NvList,
        props: &NvList,
    ) -> Result<(), (c_int, Vec<(String, i32)>)> {
        let mut errlist: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: both lists are live and only read; errlist receives a new
        // list (or stays NULL) that we own and free through NvList.
        let rc = unsafe { z::lzc_snapshot(snaps.as_ptr(), props.as_ptr(), &mut errlist) };
        // SAFETY: errlist is NULL or a list allocated for us.
        let errs = unsafe { NvList::from_raw(errlist) }
            .map(|l| l.as_ref().int32_entries())
            .unwrap_or_default();
        if rc == 0 {
            Ok(())
        } else {
            Err((rc, errs))
        }
    }

    /// `lzc_clone` of `origin` (a snapshot) as `name`.
    pub fn clone(&self, name: &CStr, origin: &CStr, props: &NvList) -> Result<(), c_int> {
        // SAFETY: names are NUL-terminated; props is live and only read.
        errno(unsafe { z::lzc_clone(name.as_ptr(), origin.as_ptr(), props.as_ptr()) })
    }

    /// `lzc_destroy_snaps` of the snapshots named as keys of `snaps`;
    /// `defer` marks a snapshot that has clones or holds for destruction
    /// with the last of them instead of failing. On failure the errno and
    /// the per-snapshot errors.
    pub fn destroy_snaps(
        &self,
        snaps: &NvList,
        defer: bool,
    ) -> Result<(), (c_int, Vec<(String, i32)>)> {
        let mut errlist: *mut z::nvlist_t = ptr::null_mut();
        let defer = if defer { z::B_TRUE } else { z::B_FALSE };
        // SAFETY: snaps is live and only read; errlist as in `snapshot`.
        let rc = unsafe { z::lzc_destroy_snaps(snaps.as_ptr(), defer, &mut errlist) };
        // SAFETY: errlist is NULL or a list allocated for us.
        let errs = unsafe { NvList::from_raw(errlist) }
            .map(|l| l.as_ref().int32_entries())
            .unwrap_or_default();
        if rc == 0 {
            Ok(())
        } else {
            Err((rc, errs))
        }
    }
}

/// `lzc_change_key`'s command to rewrap the key as an encryption root:
/// `DCP_CMD_NEW_KEY` of `enum dcp_cmd` in `sys/dsl_crypt.h`, a header of
/// the kernel module's that libzfs_core's own headers do not include (its
/// members are numbered from `DCP_CMD_NONE = 0`, then `DCP_CMD_RAW_RECV`).
const DCP_CMD_NEW_KEY: u64 = 2;

/// The length of a raw wrapping key (`keyformat=raw`, `WRAPPING_KEY_LEN`).
pub(crate) const KEY_LEN: usize = 32;

/// A key buffer as libzfs_core's `uint8_t *wkeydata, uint_t wkeylen`.
fn key_arg(key: Option<&mut [u8; KEY_LEN]>) -> (*mut u8, c_uint) {
    match key {
        Some(k) => (k.as_mut_ptr(), KEY_LEN as c_uint),
        None => (ptr::null_mut(), 0),
    }
}

impl Drop for Lzc {
    fn drop(&mut self) {
        // SAFETY: pairs the successful libzfs_core_init of `Lzc::init`.
        unsafe { z::libzfs_core_fini() }
    }
}
