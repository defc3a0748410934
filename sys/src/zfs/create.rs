//! Creating and destroying volumes: the checks made before the kernel is
//! asked, property translation, thick reservations, dependents refused.
use super::*;
use crypto::RawKey;

impl Zfs {
    /// Creates a volume. Every check (name below a pool, size not 0 and a
    /// multiple of the block size, block size a power of two, properties
    /// known, settable on volumes and of valid values) is made before
    /// anything is created; a failed create leaves nothing behind.
    ///
    /// The libzfs lock is held only to translate properties and, for a
    /// thick volume, compute its reservation; the create itself runs
    /// unlocked, so creates from many threads proceed at once.
    pub fn create_zvol(&self, spec: &ZvolSpec) -> Result<(), Error> {
        self.create_volume(spec, None)
    }

    /// [`Zfs::create_zvol`], encrypted when `key` is given: its properties
    /// then carry `encryption=aes-256-gcm`, `keyformat=raw` and
    /// `keylocation=prompt`, and the key goes with the create (the
    /// encryption properties are refused in `spec.properties`).
    pub(super) fn create_volume(&self, spec: &ZvolSpec, key: Option<&RawKey>) -> Result<(), Error> {
        let ds = spec.name.as_str();
        let parent = spec.name.parent().ok_or_else(|| InvalidName {
            name: ds.to_owned(),
            rule: NameRule::NotBelowPool,
        })?;
        let c_name = c_string(ds, ds)?;
        let props = {
            let mut lib = self.lib();
            let default_bs = lib.prop_info(Prop::VOLBLOCKSIZE).default;
            check_volume_size(ds, spec.size, spec.volblocksize, default_bs)?;
            let mut nv = new_nvlist(ds)?;
            add_u64(&mut nv, ds, "volsize", spec.size)?;
            if let Some(bs) = spec.volblocksize {
                add_u64(&mut nv, ds, "volblocksize", bs)?;
            }
            for (k, v) in &spec.properties {
                if ENCRYPTION_PROPERTIES.contains(&k.as_str()) {
                    return Err(Error::InvalidProperty {
                        dataset: ds.to_owned(),
                        property: k.clone(),
                        why: "encryption is set by create_encrypted_zvol, with its key".into(),
                    });
                }
                translate_property(&lib, ds, k, v, &mut nv)?;
            }
            if key.is_some() {
                translate_encryption(&lib, ds, &mut nv, false)?;
            }
            if spec.provisioning == Provisioning::Thick {
                let resv = lib
                    .volsize_to_reservation(&c_string(ds, spec.name.pool())?, spec.size, &nv)
                    .map_err(|_| Error::PoolNotFound {
                        pool: spec.name.pool().to_owned(),
                        dataset: ds.to_owned(),
                    })?;
                add_u64(&mut nv, ds, "refreservation", resv)?;
            }
            nv
        };
        let mut key = key.map(RawKey::copy);
        self.lzc
            .create(&c_name, true, &props, key.as_deref_mut())
            .map_err(|e| self.create_error(ds, &parent, "create", e))
    }

    /// Maps a create's or clone's errno, telling a missing pool from a
    /// missing parent.
    pub(super) fn create_error(
        &self,
        ds: &str,
        parent: &DatasetName,
        op: &'static str,
        e: c_int,
    ) -> Error {
        match e {
            errno::EEXIST => Error::AlreadyExists {
                dataset: ds.to_owned(),
            },
            errno::ENOENT if !self.exists(parent.pool()) => Error::PoolNotFound {
                pool: parent.pool().to_owned(),
                dataset: ds.to_owned(),
            },
            errno::ENOENT => Error::ParentNotFound {
                dataset: ds.to_owned(),
                parent: parent.to_string(),
            },
            e => kernel(ds, op, e),
        }
    }

    /// Destroys a filesystem or volume, never recursively: one with
    /// snapshots or children is refused with their names
    /// ([`Error::HasDependents`]) and nothing is destroyed.
    ///
    /// A volume the kernel reports busy is tried again for up to
    /// [`BUSY_GRACE`]: udev opens a new volume's device for a moment to
    /// probe it. Still busy after that is [`Error::Busy`].
    pub fn destroy(&self, name: &DatasetName) -> Result<(), Error> {
        let ds = name.as_str();
        let c_name = c_string(ds, ds)?;
        // The kernel refuses a dataset with snapshots (EBUSY) or children
        // (EEXIST) atomically in the destroy itself; their names are looked
        // up only then, for the refusal.
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match self.lzc.destroy(&c_name) {
                Ok(()) => return Ok(()),
                Err(errno::ENOENT) => {
                    return Err(Error::NotFound {
                        dataset: ds.to_owned(),
                    })
                }
                Err(errno::EEXIST) => {
                    self.refuse_dependents(name)?;
                    return Err(kernel(ds, "destroy", errno::EEXIST));
                }
                Err(errno::EBUSY) => {
                    self.refuse_dependents(name)?;
                    // udev probes a new volume's device for a moment after
                    // it appears; a holder still there after the grace
                    // period is a real user (mount, export, open).
                    if start.elapsed() >= BUSY_GRACE {
                        return Err(Error::Busy {
                            dataset: ds.to_owned(),
                            op: "destroy",
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(250));
                }
                Err(e) => return Err(kernel(ds, "destroy", e)),
            }
        }
    }

    fn refuse_dependents(&self, name: &DatasetName) -> Result<(), Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "destroy", |_, d| {
            let snapshots = d
                .snapshots()
                .map_err(|e| kernel(ds, "list snapshots of", e))?;
            let children: Vec<String> = d
                .children()
                .map_err(|e| kernel(ds, "list children of", e))?
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            if snapshots.is_empty() && children.is_empty() {
                Ok(())
            } else {
                Err(Error::HasDependents {
                    dataset: ds.to_owned(),
                    snapshots,
                    children,
                })
            }
        })
    }
}

/// The volume size checks `zfs create -V` makes, on our side first: not 0,
/// block size a power of two from 512 bytes to 16 MiB, size a multiple of
/// it.
pub(crate) fn check_volume_size(
    ds: &str,
    size: u64,
    volblocksize: Option<u64>,
    default_bs: u64,
) -> Result<(), Error> {
    let invalid = |why: String| Error::InvalidSize {
        dataset: ds.to_owned(),
        why,
    };
    if size == 0 {
        return Err(invalid("size 0: a volume needs a size".into()));
    }
    let bs = volblocksize.unwrap_or(default_bs);
    if !bs.is_power_of_two() || !(512..=16 << 20).contains(&bs) {
        return Err(invalid(format!(
            "volblocksize {bs} is not a power of two from 512 bytes to 16 MiB"
        )));
    }
    if !size.is_multiple_of(bs) {
        return Err(invalid(format!(
            "size {size} is not a multiple of volblocksize {bs}{}",
            if volblocksize.is_none() {
                " (the default)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// Adds `name=value` to a creation list in the kernel's form: index
/// properties as their numbers, numeric ones parsed (`8K`, `none`), string
/// and user properties as strings. Refuses unknown, read-only and
/// non-volume properties, and those the spec's fields own.
pub(super) fn translate_property(
    lib: &Libzfs,
    ds: &str,
    name: &str,
    value: &str,
    nv: &mut NvList,
) -> Result<(), Error> {
    translate(lib, ds, name, value, nv, Target::Volume)
}

/// [`translate_property`] for a filesystem's create: refuses
/// non-filesystem properties, and those its spec and its exports own
/// (quotas and reservations, where and whether it mounts, shares).
pub(super) fn translate_filesystem_property(
    lib: &Libzfs,
    ds: &str,
    name: &str,
    value: &str,
    nv: &mut NvList,
) -> Result<(), Error> {
    translate(lib, ds, name, value, nv, Target::Filesystem)
}

/// What a property list is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Volume,
    Filesystem,
    /// A volume's encryption properties, set once at create.
    Encryption,
}

/// Adds the encryption properties of an encrypted create
/// ([`crypto::ENCRYPTED`]) to a property list; for a change of key
/// (`change`), the key's format and location only (the cipher stays).
/// ZFS counts them read-only (they are set once, at create), which
/// [`translate_property`] refuses.
pub(super) fn translate_encryption(
    lib: &Libzfs,
    ds: &str,
    nv: &mut NvList,
    change: bool,
) -> Result<(), Error> {
    for (name, value) in ENCRYPTED {
        if !(change && name == "encryption") {
            translate(lib, ds, name, value, nv, Target::Encryption)?;
        }
    }
    Ok(())
}

/// [`translate_property`] for `target`; [`Target::Encryption`] lets the
/// read-only properties that are set at create (the encryption ones)
/// through.
fn translate(
    lib: &Libzfs,
    ds: &str,
    name: &str,
    value: &str,
    nv: &mut NvList,
    target: Target,
) -> Result<(), Error> {
    let set_once = target == Target::Encryption;
    let invalid = |why: String| Error::InvalidProperty {
        dataset: ds.to_owned(),
        property: name.to_owned(),
        why,
    };
    let c_name = cstring(name).map_err(|_| invalid("contains NUL".into()))?;
    let c_value = cstring(value).map_err(|_| invalid("value contains NUL".into()))?;
    let Some(prop) = lib.prop_by_name(&c_name) else {
        if name.contains(':') {
            if !lib.is_user_prop(&c_name) {
                return Err(invalid(
                    "not a valid user property name (lowercase letters, digits, - _ . : with a ':')".into(),
                ));
            }
            check_user_property(ds, name, value)?;
            return nv
                .add_string(name, value)
                .map_err(|e| kernel(ds, "create", e));
        }
        return Err(invalid("no such property".into()));
    };
    let info = lib.prop_info(prop);
    if let Some(why) = owned_by_spec(&info.name, target) {
        return Err(invalid(format!("{} {why}", info.name)));
    }
    if target == Target::Filesystem && !info.valid_for_filesystem {
        return Err(invalid("does not apply to filesystems".into()));
    }
    if target != Target::Filesystem && !info.valid_for_volume {
        return Err(invalid("does not apply to volumes".into()));
    }
    if info.readonly && !(set_once && ENCRYPTION_PROPERTIES.contains(&info.name.as_str())) {
        return Err(invalid("read-only".into()));
    }
    match info.kind {
        PropKind::String => nv.add_string(&info.name, value),
        PropKind::Index => {
            let Some(i) = lib.prop_index(prop, &c_value) else {
                return Err(invalid(format!(
                    "{value:?} is not a value of {}",
                    info.name
                )));
            };
            nv.add_u64(&info.name, i)
        }
        PropKind::Number => {
            let n = if value == "none" {
                Some(0)
            } else {
                lib.parse_number(&c_value)
            };
            let Some(n) = n else {
                return Err(invalid(format!("{value:?} is not a number")));
            };
            nv.add_u64(&info.name, n)
        }
    }
    .map_err(|e| kernel(ds, "create", e))
}

/// Why a property may not be given for a create of `target`: the spec's
/// fields or the caller own it. `None`: it may.
fn owned_by_spec(name: &str, target: Target) -> Option<&'static str> {
    match (name, target) {
        ("volsize" | "volblocksize" | "refreservation" | "reservation", Target::Volume) => {
            Some("follows from the size, block size and provisioning")
        }
        ("refquota" | "quota" | "refreservation" | "reservation", Target::Filesystem) => {
            Some("follows from the filesystem's capacity (its refquota)")
        }
        ("mountpoint" | "canmount", Target::Filesystem) => {
            Some("is inherited: the filesystem mounts below its parent's mountpoint")
        }
        ("sharenfs" | "sharesmb", Target::Filesystem) => {
            Some("is not used: exports are made by their caller, not by ZFS")
        }
        _ => None,
    }
}

/// User property rules ZFS enforces: name under 256 bytes, value under
/// `ZFS_MAXPROPLEN`.
pub(super) fn check_user_property(ds: &str, name: &str, value: &str) -> Result<(), Error> {
    let invalid = |why: String| Error::InvalidProperty {
        dataset: ds.to_owned(),
        property: name.to_owned(),
        why,
    };
    if !name.contains(':') {
        return Err(invalid("a user property name needs a ':'".into()));
    }
    if name.len() >= 256 {
        return Err(invalid(format!(
            "name is {} bytes, at most 255",
            name.len()
        )));
    }
    if value.len() >= zfs_sys::ZFS_MAXPROPLEN as usize {
        return Err(invalid(format!(
            "value is {} bytes, at most {}",
            value.len(),
            zfs_sys::ZFS_MAXPROPLEN - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_sizes_are_checked_before_any_call() {
        let default = 16384;
        assert!(check_volume_size("p/v", 1 << 30, None, default).is_ok());
        assert!(check_volume_size("p/v", 8192, Some(8192), default).is_ok());
        let zero = check_volume_size("p/v", 0, None, default).expect_err("must be refused");
        assert!(matches!(zero, Error::InvalidSize { .. }));
        assert!(zero.to_string().contains("p/v") && zero.to_string().contains("size 0"));
        let odd = check_volume_size("p/v", 8192, None, default).expect_err("must be refused");
        assert!(
            odd.to_string()
                .contains("not a multiple of volblocksize 16384 (the default)"),
            "{odd}"
        );
        let odd =
            check_volume_size("p/v", 3 * 4096, Some(8192), default).expect_err("must be refused");
        assert!(
            odd.to_string()
                .contains("not a multiple of volblocksize 8192"),
            "{odd}"
        );
        for bs in [0, 256, 3000, 32 << 20] {
            assert!(
                check_volume_size("p/v", 1 << 30, Some(bs), default).is_err(),
                "{bs}"
            );
        }
    }

    #[test]
    fn user_property_limits() {
        assert!(check_user_property("p/v", "democratic-csi:x", "y").is_ok());
        assert!(check_user_property("p/v", "nocolon", "y").is_err());
        assert!(check_user_property("p/v", &format!("a:{}", "b".repeat(300)), "y").is_err());
        assert!(check_user_property("p/v", "a:b", &"v".repeat(9000)).is_err());
    }
}
