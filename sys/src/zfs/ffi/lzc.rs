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
/// development files do not install): its first fields, which the
/// statistics ioctl uses and which have kept their place since ZFS on
/// Linux 0.6, then zeroes up to a size well above the whole structure
/// (about 13.7 KiB in OpenZFS 2.3), which the kernel copies in and out.
#[repr(C)]
struct ZfsCmd {
    name: [u8; 4096],
    nvlist_src: u64,
    nvlist_src_size: u64,
    nvlist_dst: u64,
    nvlist_dst_size: u64,
    nvlist_dst_filled: u32,
    rest: [u8; (32 << 10) - 4136],
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
        let bytes = name.to_bytes_with_nul();
        let mut cmd = Box::new(ZfsCmd {
            name: [0; 4096],
            nvlist_src: 0,
            nvlist_src_size: 0,
            nvlist_dst: 0,
            nvlist_dst_size: 0,
            nvlist_dst_filled: 0,
            rest: [0; (32 << 10) - 4136],
        });
        if bytes.len() > cmd.name.len() {
            return Err(ENAMETOOLONG);
        }
        cmd.name[..bytes.len()].copy_from_slice(bytes);
        if buffer.len() < STATS_BUFFER {
            buffer.resize(STATS_BUFFER, 0);
        }
        loop {
            cmd.nvlist_dst = buffer.as_mut_ptr() as u64;
            cmd.nvlist_dst_size = buffer.len() as u64;
            // SAFETY: `cmd` is larger than the kernel's zfs_cmd_t and laid
            // out as its first fields; the destination is `buffer`, live
            // and writable for the length given, and outlives the call.
            let rc = unsafe {
                rustix::ioctl::ioctl(
                    &self.dev,
                    rustix::ioctl::Updater::<OBJSET_STATS, ZfsCmd>::new(&mut cmd),
                )
            };
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

    /// `lzc_create` of a volume (or filesystem) with kernel-form properties.
    pub fn create(&self, name: &CStr, zvol: bool, props: &NvList) -> Result<(), c_int> {
        let kind = if zvol {
            z::LZC_DATSET_TYPE_ZVOL
        } else {
            z::LZC_DATSET_TYPE_ZFS
        };
        // SAFETY: name is NUL-terminated; props is a live nvlist that
        // lzc_create only reads (it copies it into the ioctl's arguments);
        // no wrapping key (NULL, 0).
        errno(unsafe { z::lzc_create(name.as_ptr(), kind, props.as_ptr(), ptr::null_mut(), 0) })
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

    /// `lzc_destroy_snaps` (not deferred) of the snapshots named as keys of
    /// `snaps`; on failure the errno and the per-snapshot errors.
    pub fn destroy_snaps(&self, snaps: &NvList) -> Result<(), (c_int, Vec<(String, i32)>)> {
        let mut errlist: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: snaps is live and only read; errlist as in `snapshot`.
        let rc = unsafe { z::lzc_destroy_snaps(snaps.as_ptr(), z::B_FALSE, &mut errlist) };
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

impl Drop for Lzc {
    fn drop(&mut self) {
        // SAFETY: pairs the successful libzfs_core_init of `Lzc::init`.
        unsafe { z::libzfs_core_fini() }
    }
}
