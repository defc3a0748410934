//! The README's "Rebind a retained volume" (under "Existing filesystem
//! adoption") run as written, against the real thing: a claim of the files
//! identity's Retain class provisioned by the real external-provisioner and
//! bound by kube-controller-manager, written, deleted (its PV Released, its
//! filesystem kept), then the section's `sh` blocks run by bash with
//! kubectl and jq, each output checked against the `text` block after it,
//! and the new claim bound by kube-controller-manager to the same PV; the
//! node stages it and reads the data written before.
//!
//! Run with `tests/lab/run tests -- claim_files_rebind`.
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams};
use pillar_csi_lab::{
    claim_bed::ClaimBed,
    claim_life::NAMESPACE,
    files_bed::{claim, volume_of},
    guides::{check_output, Guide},
    k8s::{until, ControllerManager, Sidecars},
    nfs::zget,
    Result,
};
use std::{path::Path, time::Duration};

/// How long kube-controller-manager and the provisioner may take for a step.
const STEP: Duration = Duration::from_secs(180);

/// The README's section `title` (a `###` heading), up to the next heading
/// of its level or above.
fn readme_section(title: &str) -> Result<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))?;
    let heading = format!("### {title}\n");
    let start = readme
        .find(&heading)
        .ok_or_else(|| format!("README.md has no section {heading:?}"))?;
    let rest = &readme[start + heading.len()..];
    let end = ["\n### ", "\n## "]
        .iter()
        .filter_map(|h| rest.find(h))
        .min()
        .unwrap_or(rest.len());
    Ok(rest[..end].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_files_rebind_a_retained_volume_as_the_readme_says() -> Result<()> {
    let bed = ClaimBed::start_files("frebind").await?;
    let files = bed.files.as_ref().ok_or("no files side")?;
    let dir = bed.path("rebind");
    std::fs::create_dir_all(&dir)?;
    let _kcm = ControllerManager::start(&bed.server, &dir).await?;
    let _sidecars = Sidecars::start_on(&bed.server, &files.controller_socket, &dir).await?;
    let sc = bed.storage_class(&files.class).await?;
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Retain"));
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), NAMESPACE);
    let pvs = Api::<PersistentVolume>::all(bed.admin.clone());
    let phase_of = |pv: Option<PersistentVolume>| {
        pv.and_then(|p| p.status)
            .and_then(|s| s.phase)
            .unwrap_or_default()
    };

    // The claim `media`, provisioned and bound by the real components,
    // then written on the storage node.
    let pv_name = claim(&bed.admin, "media", &files.class.storage_class, &[]).await?;
    until("PV of media Bound", STEP, || {
        let (pvs, name) = (pvs.clone(), pv_name.clone());
        async move { Ok((phase_of(pvs.get_opt(&name).await?) == "Bound").then_some(())) }
    })
    .await?;
    let dataset = format!("{}/{pv_name}", files.parent.dataset);
    let at = zget(&dataset, "mountpoint")?;
    std::fs::write(Path::new(&at).join("kept.txt"), "written through media")?;

    // Deleted: the PV is Released, the filesystem and its data stay.
    pvcs.delete("media", &DeleteParams::default()).await?;
    until("PV of media Released", STEP, || {
        let (pvs, name) = (pvs.clone(), pv_name.clone());
        async move { Ok((phase_of(pvs.get_opt(&name).await?) == "Released").then_some(())) }
    })
    .await?;
    assert_eq!(zget(&dataset, "type")?, "filesystem", "Retain keeps it");

    // The README's steps, as an operator types them.
    let section = readme_section("Rebind a retained volume")?;
    let guide = Guide::parse("README.md", &section)?;
    let blocks: Vec<_> = guide.runs().collect();
    assert_eq!(blocks.len(), 3, "the section's sh blocks");
    for block in blocks {
        let out = tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block.script])
            .current_dir(&dir)
            .env("KUBECONFIG", bed.server.kubeconfig())
            .output()
            .await?;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if !out.status.success() {
            return Err(format!(
                "README.md block at line {} of the section failed ({}):\n{}\n{stdout}{stderr}",
                block.line, out.status, block.script
            )
            .into());
        }
        check_output(&block.expect, &stdout)
            .map_err(|m| format!("README.md block at line {}: {m}", block.line))?;
    }

    // The same PV now serves media-2: staged, it holds media's data.
    let pv = pvs.get(&pv_name).await?;
    let spec = pv.spec.ok_or("no PV spec")?;
    assert_eq!(
        spec.claim_ref.and_then(|c| c.name).as_deref(),
        Some("media-2")
    );
    let csi = spec.csi.ok_or("no CSI source")?;
    let volume = volume_of(&csi);
    let staging = bed.path("rebind-staging");
    files.publish_and_stage(&volume, &staging).await?;
    let read = std::fs::read_to_string(staging.join("kept.txt"));
    files
        .unstage_and_unpublish(&volume.volume_id, &staging)
        .await?;
    assert_eq!(read?, "written through media");
    Ok(())
}
