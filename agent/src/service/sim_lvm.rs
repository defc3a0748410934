//! The LVM flavour of the simulator: one volume group, `data-vg`, whose
//! logical volumes are names with a UUID and a size in a map. Tests of the
//! layers above the agent (the CSI controller's API-server tests) adopt and
//! create LVs through it; the same behaviour against real LVM is proven by
//! the lab tests. It has no block devices: who uses an LV's device is
//! simulated too (idle, or claimed when [`SimLvm::busy`] is set), and the
//! signature probe finds nothing there.
use super::*;
use crate::backend::{Backend, BackendKind, Capacity, CreateOptions, ImportSource};
use std::{collections::BTreeMap, path::PathBuf, sync::Mutex};

/// The simulated volume group's name.
pub const VG: &str = "data-vg";
/// Its UUID.
pub const VG_UUID: &str = "VgSimA-0000-0000-0000-0000-0000-000001";

/// One simulated LV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimLv {
    /// Its UUID, in LVM's 6-4-4-4-4-4-6 form.
    pub uuid: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// An LVM backend of one VG, [`VG`], whose LVs live in a map.
#[derive(Default)]
pub struct SimLvm {
    /// Each LV by name.
    pub lvs: Mutex<BTreeMap<String, SimLv>>,
    /// Report every device as claimed by someone else (a mount or an open
    /// file the simulator cannot name): the exclusive-open probe says busy.
    pub busy: std::sync::atomic::AtomicBool,
    /// How many LVs were removed.
    pub removed: Mutex<u32>,
    serial: Mutex<u32>,
}

fn poisoned<T>(_: T) -> AgentError {
    AgentError::Internal("simulator lock poisoned".into())
}

impl SimLvm {
    /// Adds an LV of `bytes` as if made outside pillar-csi (to be adopted);
    /// returns its UUID.
    pub fn add(&self, name: &str, bytes: u64) -> String {
        let uuid = self.next_uuid();
        if let Ok(mut lvs) = self.lvs.lock() {
            lvs.insert(
                name.to_owned(),
                SimLv {
                    uuid: uuid.clone(),
                    bytes,
                },
            );
        }
        uuid
    }

    /// The LV named `name`, if any.
    pub fn lv(&self, name: &str) -> Option<SimLv> {
        self.lvs.lock().ok()?.get(name).cloned()
    }

    fn next_uuid(&self) -> String {
        let n = self
            .serial
            .lock()
            .map(|mut s| {
                *s += 1;
                *s
            })
            .unwrap_or(0);
        format!("LvSimA-0000-0000-0000-0000-0000-{n:06}")
    }

    fn name_of(at: &BackendRecord) -> Result<(&str, Option<&str>), AgentError> {
        match at {
            BackendRecord::Lv { lv, lv_uuid, .. } => Ok((lv, lv_uuid.as_deref())),
            other => Err(AgentError::Internal(format!(
                "an LVM backend was given {other:?}"
            ))),
        }
    }

    /// The LV at `at` when it exists and carries the pinned UUID (if any).
    fn current(&self, at: &BackendRecord) -> Result<Option<SimLv>, AgentError> {
        let (name, pinned) = Self::name_of(at)?;
        let lvs = self.lvs.lock().map_err(poisoned)?;
        Ok(lvs
            .get(name)
            .filter(|lv| pinned.is_none_or(|p| p == lv.uuid))
            .cloned())
    }

    fn record(name: &str, lv: &SimLv) -> (BackendRecord, VolumeState) {
        (
            BackendRecord::Lv {
                vg: VG.to_owned(),
                lv: name.to_owned(),
                lv_uuid: Some(lv.uuid.clone()),
            },
            VolumeState {
                capacity_bytes: lv.bytes,
                device_path: PathBuf::from(format!("/dev/{VG}/{name}")),
            },
        )
    }
}

impl Backend for SimLvm {
    fn kind(&self) -> BackendKind {
        BackendKind::Lvm
    }
    fn pool(&self) -> &str {
        VG
    }
    fn locate(&self, id: &VolumeId) -> Result<BackendRecord, AgentError> {
        Ok(BackendRecord::Lv {
            vg: VG.to_owned(),
            lv: id.name().to_owned(),
            lv_uuid: None,
        })
    }
    fn create(
        &self,
        at: &BackendRecord,
        bytes: u64,
        _: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let (name, _) = Self::name_of(at)?;
        if let Some(existing) = self.lv(name) {
            if existing.bytes < bytes {
                return Err(AgentError::AlreadyExists(format!(
                    "logical volume {VG}/{name} exists with {} bytes, less than the {bytes} requested",
                    existing.bytes
                )));
            }
            return Ok(Self::record(name, &existing));
        }
        let lv = SimLv {
            uuid: self.next_uuid(),
            bytes,
        };
        self.lvs
            .lock()
            .map_err(poisoned)?
            .insert(name.to_owned(), lv.clone());
        Ok(Self::record(name, &lv))
    }
    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError> {
        let (name, _) = Self::name_of(at)?;
        Ok(self.current(at)?.map(|lv| Self::record(name, &lv).1))
    }
    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError> {
        let (name, _) = Self::name_of(at)?;
        if self.current(at)?.is_some() {
            self.lvs.lock().map_err(poisoned)?.remove(name);
            *self.removed.lock().map_err(poisoned)? += 1;
        }
        Ok(())
    }
    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError> {
        let (name, _) = Self::name_of(at)?;
        let mut lvs = self.lvs.lock().map_err(poisoned)?;
        let lv = lvs.get_mut(name).ok_or_else(|| {
            AgentError::NotFound(format!("logical volume {VG}/{name} does not exist"))
        })?;
        lv.bytes = lv.bytes.max(bytes);
        Ok(lv.bytes)
    }
    fn capacity(&self) -> Result<Capacity, AgentError> {
        Ok(Capacity {
            total_bytes: 1 << 40,
            available_bytes: 1 << 39,
            used_bytes: 1 << 39,
        })
    }
    fn report_lv(&self, at: &BackendRecord) -> Result<Option<sys::lvm::Lv>, AgentError> {
        let (name, _) = Self::name_of(at)?;
        let Some(found) = self.lv(name) else {
            return Ok(None);
        };
        let bad = |what: &str, e: String| AgentError::Internal(format!("simulated {what}: {e}"));
        Ok(Some(sys::lvm::Lv {
            vg: api::names::lvm::VgName::new(VG).map_err(|e| bad("VG name", e.to_string()))?,
            name: name.to_owned(),
            hidden: false,
            vg_uuid: api::names::lvm::LvmUuid::new(VG_UUID)
                .map_err(|e| bad("VG UUID", e.to_string()))?,
            uuid: api::names::lvm::LvmUuid::new(&found.uuid)
                .map_err(|e| bad("LV UUID", e.to_string()))?,
            attr: sys::lvm::LvAttr::parse("-wi-a-----")
                .ok_or_else(|| bad("lv_attr", "unparsed".into()))?,
            segtype: "linear".into(),
            pool_lv: None,
            origin: None,
            size: found.bytes,
            data_percent: None,
            metadata_percent: None,
            path: Some(PathBuf::from(format!("/dev/{VG}/{name}"))),
            layout: vec!["linear".into()],
            role: vec!["public".into()],
        }))
    }
    fn device_usage(&self, device: &std::path::Path) -> Result<sys::block::Usage, AgentError> {
        let busy = self.busy.load(std::sync::atomic::Ordering::SeqCst);
        Ok(sys::block::Usage {
            device: sys::block::BlockDevice {
                path: device.to_owned(),
                devnum: sys::block::DevNum {
                    major: 253,
                    minor: 0,
                },
                name: "dm-0".into(),
            },
            partitions: Vec::new(),
            mounts: Vec::new(),
            holders: Vec::new(),
            exclusive: if busy {
                sys::block::Exclusive::Busy
            } else {
                sys::block::Exclusive::Free
            },
            lio: Vec::new(),
            nvmet: Vec::new(),
        })
    }
    /// The checks of the real LVM backend that need no device: layout,
    /// existence, identity and size, with the same messages.
    fn import(
        &self,
        id: &VolumeId,
        source: &ImportSource,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let refused = |why: String| crate::adopt::refused(id, why);
        let ImportSource::Lv { identity, .. } = source else {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: an LVM backend adopts logical volumes only (import_lv), not zvols"
            )));
        };
        let (vg, lv) = (identity.vg.as_str(), identity.lv.as_str());
        if id.pool() != vg || id.name() != lv {
            return Err(refused(format!(
                "layout: the volume ID must be the adopted LV's \"<vg>/<lv>\", {vg}/{lv}"
            )));
        }
        let found = self
            .lv(lv)
            .filter(|_| vg == VG)
            .ok_or_else(|| refused(format!("missing: logical volume {vg}/{lv} does not exist")))?;
        if identity.vg_uuid.as_str() != VG_UUID {
            return Err(refused(format!(
                "identity: volume group {vg} has UUID {VG_UUID}, not the pinned {}; it is another volume group",
                identity.vg_uuid
            )));
        }
        if identity.lv_uuid.as_str() != found.uuid {
            return Err(refused(format!(
                "identity: logical volume {vg}/{lv} has UUID {}, not the pinned {}; it was renamed or re-created",
                found.uuid, identity.lv_uuid
            )));
        }
        if found.bytes < bytes {
            return Err(refused(format!(
                "too small: logical volume {vg}/{lv} is {} bytes, requested capacity is {bytes} bytes; import never resizes",
                found.bytes
            )));
        }
        let state = Self::record(lv, &found);
        let used = self.device_usage(&state.1.device_path)?;
        if let Some(reason) = crate::adopt::in_use(&used, None, true) {
            return Err(refused(reason));
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::sim::{fixture, tok};
    use api::annotations::{LvIdentity, LvPolicy};
    use api::names::lvm::{LvName, LvmUuid, VgName};

    fn identity(lv: &str, lv_uuid: &str) -> ImportSource {
        ImportSource::Lv {
            identity: LvIdentity {
                vg: VgName::new(VG).expect("vg"),
                lv: LvName::new(lv).expect("lv"),
                vg_uuid: LvmUuid::new(VG_UUID).expect("vg uuid"),
                lv_uuid: LvmUuid::new(lv_uuid).expect("lv uuid"),
            },
            policy: LvPolicy::PreserveOriginal,
        }
    }

    #[tokio::test]
    async fn an_lv_is_adopted_and_released_but_never_removed() {
        let f = fixture();
        let uuid = f.lvm.add("legacy", 8 << 20);
        let other = f.lvm.add("other", 8 << 20);
        let id = format!("{VG}/legacy");
        let kind = Some(BackendKind::Lvm);
        let e = f
            .agent
            .import_volume(
                &id,
                kind,
                8 << 20,
                identity("legacy", &other),
                tok("u1", 0).as_ref(),
            )
            .await
            .expect_err("another LV's UUID");
        assert!(
            e.to_string()
                .contains("identity: logical volume data-vg/legacy has UUID"),
            "{e}"
        );
        let e = f
            .agent
            .import_volume(
                &id,
                kind,
                16 << 20,
                identity("legacy", &uuid),
                tok("u1", 0).as_ref(),
            )
            .await
            .expect_err("too small");
        assert!(e.to_string().contains("too small:"), "{e}");
        let state = f
            .agent
            .import_volume(
                &id,
                kind,
                4 << 20,
                identity("legacy", &uuid),
                tok("u1", 0).as_ref(),
            )
            .await
            .expect("adopted");
        assert_eq!(state.capacity_bytes, 8 << 20, "the LV's real size");
        f.lvm.busy.store(true, std::sync::atomic::Ordering::SeqCst);
        let e = f
            .agent
            .release_volume(&id, kind, tok("u1", 0).as_ref())
            .await
            .expect_err("claimed by someone else");
        assert!(e.to_string().contains("refused: in use:"), "{e}");
        f.lvm.busy.store(false, std::sync::atomic::Ordering::SeqCst);
        let seen = f.agent.inspect_volume(&id, kind).await.expect("inspected");
        assert_eq!(seen.lv.uuid.as_str(), uuid);
        f.agent
            .release_volume(&id, kind, tok("u1", 0).as_ref())
            .await
            .expect("released");
        assert_eq!(f.lvm.lv("legacy").map(|l| l.uuid), Some(uuid));
        assert_eq!(*f.lvm.removed.lock().expect("lock"), 0);
    }

    #[tokio::test]
    async fn a_created_lv_is_removed_by_delete() {
        let f = fixture();
        let id = format!("{VG}/pvc-1");
        let kind = Some(BackendKind::Lvm);
        let made = f
            .agent
            .create_volume(
                &id,
                kind,
                4 << 20,
                CreateOptions::default(),
                tok("u2", 0).as_ref(),
            )
            .await
            .expect("created");
        assert_eq!(made.capacity_bytes, 4 << 20);
        assert!(f.lvm.lv("pvc-1").is_some());
        f.agent
            .delete_volume(&id, kind, tok("u2", 0).as_ref())
            .await
            .expect("deleted");
        assert!(f.lvm.lv("pvc-1").is_none());
        assert_eq!(*f.lvm.removed.lock().expect("lock"), 1);
    }
}
