//! The kubelet the claim tests without a real one play
//! ([`Cluster::start`]): NodeStage and NodePublish through the bed's node
//! plugin from the VolumeAttachment the real attacher filled, their undoing,
//! and the Node's `status.volumesInUse` as kubelet reports it.
use crate::{
    claim_requests::capability,
    csi::csi_pb as pb,
    k8s_cluster::{Cluster, DRIVER},
    Result,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Patch, PatchParams};
use serde_json::{json, Value};
use std::{collections::HashMap, path::PathBuf};

/// A volume that the played kubelet staged and published.
#[derive(Debug, Clone)]
pub struct Mounted {
    /// The PV's volume handle.
    pub handle: String,
    /// Its staging path.
    pub staging: PathBuf,
    /// Its publish target: the Pod's view of the volume.
    pub target: PathBuf,
}

impl Cluster<'_> {
    /// kubelet (played): NodeStage and NodePublish of `pv` from its
    /// attachment `va`, at paths named after `tag`.
    pub async fn stage_and_publish(
        &self,
        pv: &PersistentVolume,
        va: &VolumeAttachment,
        fs_type: &str,
        tag: &str,
    ) -> Result<Mounted> {
        let csi = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.clone())
            .ok_or("PV without csi")?;
        assert_eq!(csi.driver, DRIVER);
        let publish_context: HashMap<String, String> = va
            .status
            .as_ref()
            .and_then(|s| s.attachment_metadata.clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
        let volume_context: HashMap<String, String> = csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mounted = Mounted {
            handle: csi.volume_handle.clone(),
            staging: self.bed().path(&format!("{tag}.staging")),
            target: self.bed().path(&format!("{tag}.target")),
        };
        let mut node = self.bed().node_client().await?;
        node.node_stage_volume(pb::NodeStageVolumeRequest {
            volume_id: mounted.handle.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: mounted.staging.display().to_string(),
            volume_capability: Some(capability(fs_type)),
            volume_context: volume_context.clone(),
            ..Default::default()
        })
        .await?;
        node.node_publish_volume(pb::NodePublishVolumeRequest {
            volume_id: mounted.handle.clone(),
            publish_context,
            staging_target_path: mounted.staging.display().to_string(),
            target_path: mounted.target.display().to_string(),
            volume_capability: Some(capability(fs_type)),
            volume_context,
            ..Default::default()
        })
        .await?;
        Ok(mounted)
    }

    /// kubelet (played): NodeUnpublish and NodeUnstage of `mounted`.
    pub async fn unpublish_and_unstage(&self, mounted: &Mounted) -> Result<()> {
        let mut node = self.bed().node_client().await?;
        node.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
            volume_id: mounted.handle.clone(),
            target_path: mounted.target.display().to_string(),
        })
        .await?;
        node.node_unstage_volume(pb::NodeUnstageVolumeRequest {
            volume_id: mounted.handle.clone(),
            staging_target_path: mounted.staging.display().to_string(),
        })
        .await?;
        Ok(())
    }

    /// kubelet (played): the Node's `status.volumesInUse` becomes the
    /// volumes of `handles` (the attach-detach controller detaches none of
    /// them while listed).
    pub async fn report_in_use(&self, handles: &[&str]) -> Result<()> {
        let in_use: Vec<String> = handles
            .iter()
            .map(|h| format!("kubernetes.io/csi/{DRIVER}^{h}"))
            .collect();
        let value = if in_use.is_empty() {
            Value::Null
        } else {
            json!(in_use)
        };
        self.api::<Node>()
            .patch_status(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"volumesInUse": value}})),
            )
            .await?;
        Ok(())
    }
}
