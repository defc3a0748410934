//! Tests of the fence-mark store (`marks.rs`).
use super::*;
use crate::fence::Token;

#[test]
fn encoding_round_trips_and_stays_in_the_folder() {
    for id in [
        "tank/pvc-1",
        "data-vg/legacy",
        "../x",
        "a/../../b",
        "a\0b",
        "a\nb",
        ".",
        "é/ü",
    ] {
        let e = encode(id);
        assert!(!e.contains(['/', '.', '\0', '\n']), "{e}");
        assert_eq!(decode(&e).as_deref(), Some(id));
    }
    assert_eq!(decode("%zz"), None);
    assert_eq!(decode("%4"), None);
}

#[test]
fn marks_survive_and_corruption_is_confined() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = MarkStore::open(dir.path().join("agent"))?;
    let mut mark = FenceMark::new("tank/pvc-1");
    let (fence, _) = mark.fence.admit(
        "tank/pvc-1",
        Some(&Token {
            volume_uid: "u1".into(),
            generation: 2,
        }),
        crate::fence::Call::Other,
    )?;
    mark.fence = fence;
    mark.backend = Some(BackendRecord::Zvol {
        dataset: "tank/k8s/pvc-1".into(),
        guid: Some("12345".into()),
    });
    store.save(&mark)?;
    store.save(&FenceMark::new("vg/lv"))?;
    assert_eq!(store.load("tank/pvc-1")?, Some(mark));
    assert_eq!(
        store.volume_ids()?,
        vec!["tank/pvc-1".to_owned(), "vg/lv".to_owned()]
    );
    assert_eq!(store.load("tank/none")?, None);

    fs::write(store.path("vg/lv")?, b"{not json")?;
    let err = store.load("vg/lv").expect_err("corrupt");
    assert!(matches!(err, MarkError::Corrupt { .. }) && err.to_string().contains("vg/lv"));
    assert!(
        store.load("tank/pvc-1")?.is_some(),
        "other marks are unaffected"
    );
    assert!(matches!(
        store.load(&"x".repeat(300)),
        Err(MarkError::TooLong(_))
    ));
    Ok(())
}

#[test]
fn a_killed_write_leaves_no_temporary_file_after_a_restart(
) -> Result<(), Box<dyn std::error::Error>> {
    // The agent killed between the temporary file and its rename (the
    // crash point `mark-written-unrenamed`) left `.<mark>.<pid>.<n>.tmp`;
    // the next start removes it and keeps the marks.
    let dir = tempfile::tempdir()?;
    let store = MarkStore::open(dir.path())?;
    store.save(&FenceMark::new("tank/v"))?;
    let stale = dir.path().join(".tank%2Fv.mark.json.4242.0.tmp");
    fs::write(&stale, b"{\"half")?;
    let store = MarkStore::open(dir.path())?;
    assert!(!stale.exists());
    assert_eq!(store.volume_ids()?, vec!["tank/v".to_owned()]);
    assert_eq!(fs::read_dir(dir.path())?.count(), 1);
    Ok(())
}

#[test]
fn concurrent_saves_of_one_mark_never_collide() -> Result<(), Box<dyn std::error::Error>> {
    // Two writers of one volume's mark at once (a detached operation and
    // the next request, say) each need a temporary file of their own: a
    // shared name makes one writer rename the other's half-written file.
    let dir = tempfile::tempdir()?;
    let store = MarkStore::open(dir.path().join("agent"))?;
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || -> Result<(), MarkError> {
                for i in 0..150u64 {
                    let mut mark = FenceMark::new("tank/pvc-1");
                    mark.backend = Some(BackendRecord::Zvol {
                        dataset: format!("tank/k8s/pvc-{w}-{i}"),
                        guid: None,
                    });
                    store.save(&mark)?;
                }
                Ok(())
            })
        })
        .collect();
    for w in writers {
        w.join().map_err(|_| "writer panicked")??;
    }
    assert!(store.load("tank/pvc-1")?.is_some(), "the mark parses");
    let left: Vec<_> = fs::read_dir(store.dir())?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");
    Ok(())
}

#[test]
fn a_mark_written_before_the_zvol_pin_still_reads() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = MarkStore::open(dir.path())?;
    let mut mark = FenceMark::new("tank/old");
    mark.backend = Some(BackendRecord::Zvol {
        dataset: "tank/k8s/old".into(),
        guid: None,
    });
    store.save(&mark)?;
    let text = fs::read_to_string(store.path("tank/old")?)?;
    assert!(!text.contains("guid"), "{text}");
    assert_eq!(store.load("tank/old")?, Some(mark));
    Ok(())
}
