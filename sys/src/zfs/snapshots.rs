//! Snapshots and clones, and the dependents that keep a snapshot alive.
use super::*;

impl Zfs {
    /// Takes a snapshot, with optional user properties (`module:name`).
    pub fn snapshot(
        &self,
        snap: &SnapshotName,
        user_properties: &[(String, String)],
    ) -> Result<(), Error> {
        let s = snap.as_str();
        let mut snaps = new_nvlist(s)?;
        snaps.add_boolean(s).map_err(|e| kernel(s, "snapshot", e))?;
        let mut props = new_nvlist(s)?;
        for (k, v) in user_properties {
            check_user_property(s, k, v)?;
            props
                .add_string(k, v)
                .map_err(|e| kernel(s, "snapshot", e))?;
        }
        self.lzc.snapshot(&snaps, &props).map_err(|(e, errs)| {
            let e = errs.first().map(|(_, e)| *e).unwrap_or(e);
            match e {
                errno::EEXIST => Error::AlreadyExists {
                    dataset: s.to_owned(),
                },
                errno::ENOENT => Error::NotFound {
                    dataset: snap.dataset().to_string(),
                },
                errno::ENOSPC => Error::NoSpace {
                    dataset: s.to_owned(),
                    op: "snapshot",
                },
                e => kernel(s, "snapshot", e),
            }
        })
    }

    /// Clones `origin` as `target` (sparse: no reservation), with further
    /// properties as in [`ZvolSpec::properties`].
    pub fn clone_snapshot(
        &self,
        origin: &SnapshotName,
        target: &DatasetName,
        properties: &[(String, String)],
    ) -> Result<(), Error> {
        let ds = target.as_str();
        let parent = target.parent().ok_or_else(|| InvalidName {
            name: ds.to_owned(),
            rule: NameRule::NotBelowPool,
        })?;
        let props = {
            let lib = self.lib();
            let mut nv = new_nvlist(ds)?;
            for (k, v) in properties {
                translate_property(&lib, ds, k, v, &mut nv)?;
            }
            nv
        };
        let c_origin = c_string(origin.as_str(), origin.as_str())?;
        self.lzc
            .clone(&c_string(ds, ds)?, &c_origin, &props)
            .map_err(|e| match e {
                errno::ENOENT if !self.exists(origin.as_str()) => Error::NotFound {
                    dataset: origin.to_string(),
                },
                e => self.create_error(ds, &parent, "clone", e),
            })
    }

    /// Destroys a snapshot; one that clones depend on is refused with their
    /// names ([`Error::HasClones`]) and kept.
    pub fn destroy_snapshot(&self, snap: &SnapshotName) -> Result<(), Error> {
        let clones = self.clones_of(snap)?;
        if !clones.is_empty() {
            return Err(Error::HasClones {
                snapshot: snap.to_string(),
                clones,
            });
        }
        self.destroy_snaps(snap, false)
    }

    /// Destroys a snapshot now if nothing depends on it; one with clones
    /// (or holds) is marked `defer_destroy` instead, and the kernel destroys
    /// it in the same transaction as its last clone. Its data stays
    /// readable through the clones until then; a snapshot already marked is
    /// marked again without error.
    pub fn destroy_snapshot_deferred(&self, snap: &SnapshotName) -> Result<(), Error> {
        self.destroy_snaps(snap, true)
    }

    fn destroy_snaps(&self, snap: &SnapshotName, defer: bool) -> Result<(), Error> {
        let s = snap.as_str();
        let mut snaps = new_nvlist(s)?;
        snaps.add_boolean(s).map_err(|e| kernel(s, "destroy", e))?;
        self.lzc.destroy_snaps(&snaps, defer).map_err(|(e, errs)| {
            match errs.first().map(|(_, e)| *e).unwrap_or(e) {
                errno::EEXIST => Error::HasClones {
                    snapshot: s.to_owned(),
                    clones: self.clones_of(snap).unwrap_or_default(),
                },
                errno::EBUSY => Error::Busy {
                    dataset: s.to_owned(),
                    op: "destroy (held)",
                },
                e => kernel(s, "destroy", e),
            }
        })
    }

    /// A snapshot's GUID, creation time, size, clones, deferred-destroy mark
    /// and user properties, in one open.
    pub fn snapshot_info(&self, snap: &SnapshotName) -> Result<SnapshotInfo, Error> {
        let s = snap.as_str();
        self.with_open(s, ffi::TYPE_SNAPSHOT, "get", |_, d| {
            Ok(SnapshotInfo {
                name: snap.clone(),
                guid: d.prop_u64(Prop::GUID).unwrap_or_default(),
                creation: d.prop_u64(Prop::CREATION).unwrap_or_default(),
                volsize: d.prop_u64(Prop::VOLSIZE),
                used: d.prop_u64(Prop::USED).unwrap_or_default(),
                clones: split_clones(d.prop_string(Prop::CLONES)),
                defer_destroy: d.prop_u64(Prop::DEFER_DESTROY) == Some(1),
                user_properties: d.user_props().into_iter().collect(),
            })
        })
    }

    /// The clones of a snapshot (its `clones` property).
    fn clones_of(&self, snap: &SnapshotName) -> Result<Vec<String>, Error> {
        let s = snap.as_str();
        self.with_open(s, ffi::TYPE_SNAPSHOT, "destroy", |_, d| {
            Ok(split_clones(d.prop_string(Prop::CLONES)))
        })
    }
}

/// The `clones` property's comma-separated names.
fn split_clones(clones: Option<String>) -> Vec<String> {
    clones
        .map(|c| {
            c.split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}
