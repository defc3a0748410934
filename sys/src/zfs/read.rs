//! Reading and changing what exists: dataset info, properties, volume
//! size, listings and pool capacity.
use super::*;
use std::sync::OnceLock;

impl Zfs {
    /// A dataset's type, sizes, guid and user properties, in one open.
    pub fn get(&self, name: &DatasetName) -> Result<DatasetInfo, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "get", |_, d| {
            let kind = DatasetType::from_raw(d.kind());
            let vol = |p| {
                (kind == DatasetType::Volume)
                    .then(|| d.prop_u64(p))
                    .flatten()
            };
            Ok(DatasetInfo {
                name: ds.to_owned(),
                kind,
                volsize: vol(Prop::VOLSIZE),
                volblocksize: vol(Prop::VOLBLOCKSIZE),
                refreservation: d.prop_u64(Prop::REFRESERVATION),
                used: d.prop_u64(Prop::USED),
                guid: d.prop_u64(Prop::GUID),
                origin: d
                    .prop_string(Prop::ORIGIN)
                    .filter(|o| !o.is_empty() && o != "-"),
                user_properties: d.user_props().into_iter().collect(),
            })
        })
    }

    /// A dataset's type.
    pub fn dataset_type(&self, name: &DatasetName) -> Result<DatasetType, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "get type of", |_, d| {
            Ok(DatasetType::from_raw(d.kind()))
        })
    }

    /// A volume's `volsize` in bytes; a filesystem is [`Error::WrongType`].
    pub fn volsize(&self, name: &DatasetName) -> Result<u64, Error> {
        self.volume_stats(name).map(|s| s.volsize)
    }

    /// A volume's size and GUID; a filesystem is [`Error::WrongType`].
    ///
    /// One statistics ioctl and its property list unpacked, without the
    /// libzfs lock or a dataset handle, so reads from many threads run at
    /// once.
    pub fn volume_stats(&self, name: &DatasetName) -> Result<VolumeStats, Error> {
        let ds = name.as_str();
        let op = "get volume statistics of";
        let mut buffer = Vec::new();
        let len = match self.lzc.stats_packed(&c_string(ds, ds)?, &mut buffer) {
            Ok(len) => len,
            Err(errno::ENOENT) => {
                return Err(Error::NotFound {
                    dataset: ds.to_owned(),
                })
            }
            Err(e) => return Err(kernel(ds, op, e)),
        };
        let packed = &buffer[..len];
        // Read in place; a list this reader does not understand is
        // unpacked by libnvpair instead.
        let values = match packed::property_values(packed, &["volsize", "guid"]) {
            Some(values) => values,
            None => {
                let props = NvList::unpack(packed).map_err(|e| kernel(ds, op, e))?;
                let value =
                    |key: &std::ffi::CStr| props.as_ref().list(key).and_then(|p| p.u64(c"value"));
                vec![value(c"volsize"), value(c"guid")]
            }
        };
        if let [Some(volsize), Some(guid)] = values[..] {
            return Ok(VolumeStats { volsize, guid });
        }
        // No volsize: not a volume (or one being received); libzfs names
        // what it is.
        self.with_open(ds, ffi::TYPE_DATASET, op, |_, d| {
            let kind = DatasetType::from_raw(d.kind());
            if kind != DatasetType::Volume {
                return Err(wrong_type(ds, kind));
            }
            Err(Error::Libzfs {
                dataset: ds.to_owned(),
                op,
                code: 0,
                message: "the kernel's statistics name no volsize or guid".into(),
            })
        })
    }

    /// A volume's GUID, from the statistics ioctl without its property list
    /// (no property is gathered, packed or read): what an identity check
    /// needs. In the lab it costs about a sixth less than
    /// [`Zfs::volume_stats`]; the ioctl's own path is most of both. A
    /// filesystem is [`Error::WrongType`].
    ///
    /// The first call of the process on a volume also reads the GUID from
    /// the property list: if the two differ (a kernel whose `zfs_cmd_t`
    /// moved the statistics), this and every later call read the property
    /// list instead.
    pub fn volume_guid(&self, name: &DatasetName) -> Result<u64, Error> {
        static FAST_AGREES: OnceLock<bool> = OnceLock::new();
        if FAST_AGREES.get() == Some(&false) {
            return self.volume_stats(name).map(|s| s.guid);
        }
        let ds = name.as_str();
        let fast = match self.lzc.fast_stats(&c_string(ds, ds)?) {
            Ok(fast) => fast,
            Err(errno::ENOENT) => {
                return Err(Error::NotFound {
                    dataset: ds.to_owned(),
                })
            }
            Err(e) => return Err(kernel(ds, "get volume statistics of", e)),
        };
        if FAST_AGREES.get().is_none() {
            let full = self.volume_stats(name)?;
            let agrees = *FAST_AGREES.get_or_init(|| fast.zvol && fast.guid == full.guid);
            return Ok(if agrees { fast.guid } else { full.guid });
        }
        if !fast.zvol {
            // libzfs names what it is.
            return self.volume_stats(name).map(|s| s.guid);
        }
        Ok(fast.guid)
    }

    /// One property as `zfs get -Hp -o value` prints it (native, literal
    /// numbers) or a user property's value; `None` for an unset user
    /// property or a property that does not apply.
    pub fn property(&self, name: &DatasetName, property: &str) -> Result<Option<String>, Error> {
        let ds = name.as_str();
        let c_prop = cstring(property).map_err(|_| Error::InvalidProperty {
            dataset: ds.to_owned(),
            property: property.to_owned(),
            why: "contains NUL".into(),
        })?;
        self.with_open(ds, ffi::TYPE_DATASET, "get property of", |lib, d| match lib
            .prop_by_name(&c_prop)
        {
            Some(p) => Ok(d.prop_string(p)),
            None if property.contains(':') => Ok(d
                .user_props()
                .into_iter()
                .find_map(|(k, v)| (k == property).then_some(v))),
            None => Err(Error::InvalidProperty {
                dataset: ds.to_owned(),
                property: property.to_owned(),
                why: "no such property".into(),
            }),
        })
    }

    /// Sets a property as `zfs set name=value` would (libzfs translates the
    /// value); `volsize` goes through [`Zfs::set_volsize`].
    pub fn set_property(
        &self,
        name: &DatasetName,
        property: &str,
        value: &str,
    ) -> Result<(), Error> {
        let ds = name.as_str();
        if property == "volsize" {
            return Err(Error::InvalidProperty {
                dataset: ds.to_owned(),
                property: property.to_owned(),
                why: "use set_volsize, which refuses to shrink".into(),
            });
        }
        let invalid = |why: &str| Error::InvalidProperty {
            dataset: ds.to_owned(),
            property: property.to_owned(),
            why: why.to_owned(),
        };
        let c_prop = cstring(property).map_err(|_| invalid("contains NUL"))?;
        let c_value = cstring(value).map_err(|_| invalid("value contains NUL"))?;
        self.with_open(ds, ffi::TYPE_DATASET, "set property of", |lib, d| {
            d.set_prop(lib, &c_prop, &c_value)
                .map_err(|e| libzfs(ds, "set property of", e))
        })
    }

    /// Removes the value of `property` set on dataset `name`, as `zfs
    /// inherit property name` would (a user property then shows its
    /// parent's value, if any); one not set is a no-op.
    pub fn inherit_property(&self, name: &DatasetName, property: &str) -> Result<(), Error> {
        let ds = name.as_str();
        let c_prop = cstring(property).map_err(|_| Error::InvalidProperty {
            dataset: ds.to_owned(),
            property: property.to_owned(),
            why: "contains NUL".into(),
        })?;
        self.with_open(ds, ffi::TYPE_DATASET, "inherit property of", |lib, d| {
            d.inherit_prop(lib, &c_prop)
                .map_err(|e| libzfs(ds, "inherit property of", e))
        })
    }

    /// Grows a volume to `new_size` bytes (a multiple of its block size).
    /// The same size is a no-op; a smaller one is [`Error::Shrink`]. A thick
    /// volume's reservation grows with it, as `zfs set volsize` does.
    pub fn set_volsize(&self, name: &DatasetName, new_size: u64) -> Result<(), Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "resize", |lib, d| {
            let kind = DatasetType::from_raw(d.kind());
            if kind != DatasetType::Volume {
                return Err(wrong_type(ds, kind));
            }
            let current = d.prop_u64(Prop::VOLSIZE).unwrap_or(0);
            if new_size < current {
                return Err(Error::Shrink {
                    dataset: ds.to_owned(),
                    current,
                    requested: new_size,
                });
            }
            if new_size == current {
                return Ok(());
            }
            let bs = d.prop_u64(Prop::VOLBLOCKSIZE).unwrap_or(1);
            check_volume_size(ds, new_size, Some(bs), bs)?;
            let value = c_string(ds, &new_size.to_string())?;
            d.set_prop(lib, c"volsize", &value)
                .map_err(|e| libzfs(ds, "resize", e))
        })
    }

    /// The volumes exactly one level below `parent` (not deeper, no
    /// filesystems), sorted by name. ZFS also allows a space in names; a
    /// volume whose name breaks [`check_dataset_name`] is left out, as
    /// nothing here can manage it.
    pub fn list_zvols(&self, parent: &DatasetName) -> Result<Vec<DatasetName>, Error> {
        let ds = parent.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "list", |_, d| {
            let mut out: Vec<DatasetName> = d
                .children()
                .map_err(|e| kernel(ds, "list", e))?
                .into_iter()
                .filter(|(_, t)| *t == ffi::TYPE_VOLUME)
                .filter_map(|(child, _)| DatasetName::new(&child).ok())
                .collect();
            out.sort();
            Ok(out)
        })
    }

    /// The snapshots of a dataset, sorted by name (those whose names break
    /// the naming rules left out; [`Zfs::destroy`] still names them all).
    pub fn snapshots(&self, name: &DatasetName) -> Result<Vec<SnapshotName>, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "list snapshots of", |_, d| {
            let mut out: Vec<SnapshotName> = d
                .snapshots()
                .map_err(|e| kernel(ds, "list snapshots of", e))?
                .iter()
                .filter_map(|s| SnapshotName::new(s).ok())
                .collect();
            out.sort();
            Ok(out)
        })
    }

    /// A pool's size, free and allocated bytes.
    pub fn pool_capacity(&self, pool: &str) -> Result<PoolCapacity, Error> {
        let lib = self.lib();
        let p = lib
            .open_pool(&c_string(pool, pool)?)
            .map_err(|_| Error::PoolNotFound {
                pool: pool.to_owned(),
                dataset: pool.to_owned(),
            })?;
        Ok(PoolCapacity {
            size: p.prop_u64(PoolProp::Size),
            free: p.prop_u64(PoolProp::Free),
            allocated: p.prop_u64(PoolProp::Allocated),
        })
    }
}
