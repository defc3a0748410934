//! The claims the `claim_` lab test and the demo run, on one bed: a new
//! zvol over NVMe/TCP, a new thin LV over iSCSI, and a zvol holding data
//! imported through the PVC annotation.
use crate::{
    block::pattern,
    claim_bed::ClaimBed,
    claim_life::{life, Claim},
    run, Result,
};
use std::{fs, io::Write, path::Path};

/// A zvol made before the claim, holding data, for an import.
#[derive(Debug, Clone)]
pub struct Legacy {
    /// The zvol's full dataset name (the annotation's value).
    pub dataset: String,
    /// The file on its filesystem.
    pub file: String,
    /// The file's content.
    pub data: Vec<u8>,
}

/// Every case on one bed, each under a heading: a zvol over NVMe/TCP and a
/// thin LV over iSCSI, each created, published, staged, written, grown and
/// deleted, then a zvol holding data imported through the PVC annotation
/// and served over iSCSI. The `claim_` test and the demo both run this.
pub async fn every_case(bed: &ClaimBed) -> Result<()> {
    let heading = |text: &str| println!("\n=== {text} ===");
    heading("A new zvol over NVMe/TCP (ext4), grown from 64 to 128 MiB");
    life(
        bed,
        &Claim {
            name: "zvol-nvme".into(),
            class: bed.objects.zvol_nvme.clone(),
            bytes: 64 << 20,
            grown: Some(128 << 20),
            import: None,
        },
    )
    .await?;
    heading("A new thin LV over iSCSI (xfs), grown from 320 to 400 MiB");
    life(
        bed,
        &Claim {
            name: "lv-iscsi".into(),
            class: bed.objects.lv_iscsi.clone(),
            bytes: 320 << 20,
            grown: Some(400 << 20),
            import: None,
        },
    )
    .await?;
    heading("An existing zvol with data, imported by a PVC annotation, over iSCSI (ext4)");
    let legacy = legacy_zvol(bed, "legacy-data", 96 << 20)?;
    println!(
        "made by hand beforehand: zvol {} with ext4 and the file {} ({} bytes)",
        legacy.dataset,
        legacy.file,
        legacy.data.len()
    );
    life(
        bed,
        &Claim {
            name: "imported".into(),
            class: bed.objects.zvol_iscsi.clone(),
            bytes: 64 << 20,
            grown: None,
            import: Some(legacy),
        },
    )
    .await
}

/// Makes a zvol `name` of `bytes` under the bed's parent dataset, as an
/// earlier driver would have left it: an ext4 filesystem holding a file.
pub fn legacy_zvol(bed: &ClaimBed, name: &str, bytes: u64) -> Result<Legacy> {
    let dataset = format!("{}/{name}", bed.parent.dataset());
    run("zfs", &["create", "-V", &bytes.to_string(), &dataset])?;
    let dev = Path::new("/dev/zvol").join(&dataset);
    crate::block::wait_for(&dev, std::time::Duration::from_secs(60))?;
    run("mkfs.ext4", &["-q", "-F", &dev.to_string_lossy()])?;
    let dir = bed.path("legacy");
    let mounted = crate::mount::Mounted::mount(&dev, dir.clone(), "rw")?;
    let data = pattern(42, 256 << 10);
    let file = "written-before-the-import";
    let mut f = fs::File::create(dir.join(file))?;
    f.write_all(&data)?;
    f.sync_all()?;
    drop(f);
    mounted.unmount()?;
    Ok(Legacy {
        dataset,
        file: file.to_owned(),
        data,
    })
}
