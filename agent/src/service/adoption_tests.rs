//! Adoption rules over the simulator: which DeleteVolume retries an ended
//! lifecycle admits, and the signature probe an import records.
use super::sim::*;
use super::*;
use crate::{
    backend::{Backend, CreateOptions, ImportSource},
    fence::Lifecycle,
    marks::ProbeRecord,
};

/// A mark for `tank/<name>` as an LV adoption leaves it: the pin with its
/// policy, the LV recorded, a live lifecycle `u1` at generation 2.
fn adopted_lv(name: &str, preserve_original: bool) -> FenceMark {
    let mut mark = FenceMark::new(&format!("tank/{name}"));
    mark.fence.live = Some(Lifecycle {
        volume_uid: "u1".into(),
        generation: 2,
    });
    mark.backend = Some(BackendRecord::Lv {
        vg: "tank".into(),
        lv: name.into(),
        lv_uuid: Some("lv-uuid".into()),
    });
    mark.adopted = Some(AdoptedSource::Lv {
        vg: "tank".into(),
        lv: name.into(),
        vg_uuid: "vg-uuid".into(),
        lv_uuid: "lv-uuid".into(),
        preserve_original,
    });
    mark
}

/// The spec (adopt-lvm-lv.md, "What the operator must never do"): after a
/// lifecycle ends, every mutating request with its token is refused; the one
/// exception is a DeleteVolume that destroyed the volume (Managed). The
/// DeleteVolume of a PreserveOriginal LV destroyed nothing: its retry is
/// refused like any other, and the refusal changes nothing.
#[tokio::test]
async fn a_preserved_delete_retry_is_refused_and_a_managed_one_succeeds() -> Result<(), AgentError>
{
    let f = fixture();
    let a = &f.agent;
    a.marks().save(&adopted_lv("kept", true))?;
    a.delete_volume("tank/kept", None, tok("u1", 2).as_ref())
        .await?;
    let after_delete = a.marks().load("tank/kept")?;
    let retry = a
        .delete_volume("tank/kept", None, tok("u1", 2).as_ref())
        .await;
    assert!(
        matches!(&retry, Err(AgentError::FailedPrecondition(m)) if m.contains("lifecycle u1 has ended")),
        "{retry:?}"
    );
    assert_eq!(
        a.marks().load("tank/kept")?,
        after_delete,
        "a refusal changes nothing"
    );

    // Managed: the delete destroyed the LV; its identical retry succeeds
    // without touching the backend again.
    let managed = BackendRecord::Lv {
        vg: "tank".into(),
        lv: "managed".into(),
        lv_uuid: Some("lv-uuid".into()),
    };
    f.backend.create(&managed, 10, &CreateOptions::default())?;
    a.marks().save(&adopted_lv("managed", false))?;
    a.delete_volume("tank/managed", None, tok("u1", 2).as_ref())
        .await?;
    assert!(
        f.backend.lookup(&managed)?.is_none(),
        "Managed is destroyed"
    );
    a.delete_volume("tank/managed", None, tok("u1", 2).as_ref())
        .await?;
    let destroyed = *f
        .backend
        .destroyed
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?;
    assert_eq!(destroyed, 1, "the retry touched the backend");
    Ok(())
}

/// A mark written before the exception was narrowed records the preserved
/// LV's DeleteVolume token; its retry is refused all the same.
#[tokio::test]
async fn an_old_mark_recording_a_preserved_delete_does_not_admit_its_retry(
) -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let mut mark = adopted_lv("kept", true);
    mark.fence = mark.fence.end(tok("u1", 2));
    mark.backend = None;
    a.marks().save(&mark)?;
    let retry = a
        .delete_volume("tank/kept", None, tok("u1", 2).as_ref())
        .await;
    assert!(
        matches!(&retry, Err(AgentError::FailedPrecondition(m)) if m.contains("lifecycle u1 has ended")),
        "{retry:?}"
    );
    assert_eq!(a.marks().load("tank/kept")?, Some(mark));
    Ok(())
}

/// An ext2 superblock (magic, block and inode counts, revision 1) at 1024 in
/// an otherwise empty 4 MiB image: enough for libblkid to name it.
fn ext2_image(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let mut image = vec![0u8; 4 << 20];
    let sb = 1024;
    image[sb..sb + 4].copy_from_slice(&256u32.to_le_bytes());
    image[sb + 4..sb + 8].copy_from_slice(&4096u32.to_le_bytes());
    image[sb + 56..sb + 58].copy_from_slice(&0xEF53u16.to_le_bytes());
    image[sb + 76..sb + 80].copy_from_slice(&1u32.to_le_bytes());
    let path = dir.join("ext2.img");
    std::fs::write(&path, image)?;
    Ok(path)
}

/// An import runs the signature probe and records what it found in the
/// mark; a blank device is recorded as blank, and nothing is refused for
/// what the probe found. DeleteVolume drops the record with the pin.
#[tokio::test]
async fn an_import_records_the_signature_probe() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let io = |e: std::io::Error| AgentError::Internal(e.to_string());
    let dir = tempfile::tempdir().map_err(io)?;
    for (name, device, expected) in [
        (
            "fs",
            ext2_image(dir.path()).map_err(io)?,
            ProbeRecord::Filesystem {
                filesystem_type: "ext2".into(),
            },
        ),
        ("blank", dir.path().join("blank.img"), ProbeRecord::Blank),
    ] {
        if !device.exists() {
            std::fs::write(&device, vec![0u8; 4 << 20]).map_err(io)?;
        }
        let dataset = format!("tank/k8s/{name}");
        f.backend.create(
            &BackendRecord::Zvol {
                dataset: dataset.clone(),
                guid: None,
            },
            10,
            &CreateOptions::default(),
        )?;
        *f.backend
            .import_device
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))? = Some(device);
        let id = format!("tank/{name}");
        a.import_volume(
            &id,
            None,
            10,
            ImportSource::Zvol { dataset, key: None },
            tok("u1", 1).as_ref(),
        )
        .await?;
        let mark = a.marks().load(&id)?;
        assert_eq!(
            mark.as_ref().and_then(|m| m.import_probe.clone()),
            Some(expected),
            "{id}"
        );
        a.delete_volume(&id, None, tok("u1", 1).as_ref()).await?;
        let mark = a.marks().load(&id)?;
        assert_eq!(mark.and_then(|m| m.import_probe), None, "{id}");
    }
    Ok(())
}

/// A ReleaseVolume whose reply was lost (the agent killed after its mark was
/// committed; the crash matrix's `mark-committed` case) is repeated by the
/// controller with the same token: it succeeds and changes nothing. Another
/// request of the ended lifecycle is still refused.
#[tokio::test]
async fn a_repeated_release_succeeds_and_changes_nothing() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    a.create_volume(
        "tank/r",
        None,
        10,
        CreateOptions::default(),
        tok("u1", 1).as_ref(),
    )
    .await?;
    a.export_volume(
        "tank/r",
        None,
        Protocol::NvmeofTcp,
        acl(),
        tok("u1", 1).as_ref(),
    )
    .await?;
    a.release_volume("tank/r", None, tok("u1", 1).as_ref())
        .await?;
    let file = a.marks().dir().join(format!(
        "{}{}",
        crate::marks::encode("tank/r"),
        crate::marks::SUFFIX
    ));
    let committed = std::fs::read(&file).map_err(|e| AgentError::Internal(e.to_string()))?;
    a.release_volume("tank/r", None, tok("u1", 1).as_ref())
        .await?;
    assert_eq!(
        std::fs::read(&file).map_err(|e| AgentError::Internal(e.to_string()))?,
        committed,
        "the repeat wrote nothing"
    );
    // Another generation of the ended lifecycle, or an export, is refused.
    for refused in [
        a.release_volume("tank/r", None, tok("u1", 2).as_ref())
            .await,
        a.export_volume(
            "tank/r",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 1).as_ref(),
        )
        .await
        .map(drop),
    ] {
        let e = refused.expect_err("ended");
        assert!(e.to_string().contains("has ended"), "{e}");
    }
    // A new lifecycle's DeleteVolume ends the release's retry window.
    a.delete_volume("tank/r", None, tok("u2", 1).as_ref())
        .await?;
    let e = a
        .release_volume("tank/r", None, tok("u1", 1).as_ref())
        .await
        .expect_err("ended");
    assert!(e.to_string().contains("has ended"), "{e}");
    Ok(())
}
