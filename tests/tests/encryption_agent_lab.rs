//! Encrypted zvols through the agent and the node plugin on the lab's real
//! kernel: a zvol made encrypted under a key of its own, staged and written
//! over NVMe/TCP; the storage side rebooted (the agent killed, the kernel
//! target emptied, the key unloaded, as a power cycle leaves them) and
//! brought back by the agent alone, the host's filesystem writing again
//! and every byte reading back; no key, the volume's or the key-encryption
//! key, in the agent's state folder, log, command line or environment; a
//! key that cannot be opened keeps the volume unexported; the refusals; a
//! change of the volume's own key, whole and interrupted at each step.
//!
//! One test in its own binary: emptying the kernel target would cut every
//! other test's exports in the same guest.
//!
//! Run with `tests/lab/run tests -- encryption_agent`.
use pillar_csi_agent::sealed_key::{Kek, NEXT_PROPERTY, PROPERTY};
use pillar_csi_lab::{agent::pb, block::pattern, node_bed::*, run, Lab, Result};
use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};
use tonic::Code;

/// How long the storage side stays down.
const DOWN: Duration = Duration::from_secs(5);
/// How long the host's writer may take to get past the reboot.
const RESUME_BOUND: Duration = Duration::from_secs(240);

/// `zfs get` of one property's value.
fn zfs_get(dataset: &str, property: &str) -> Result<String> {
    Ok(
        run("zfs", &["get", "-H", "-o", "value", property, dataset])?
            .trim()
            .to_owned(),
    )
}

/// Whether the kernel target exports subsystem `nqn`.
fn exported(nqn: &str) -> bool {
    Path::new("/sys/kernel/config/nvmet/subsystems")
        .join(nqn)
        .exists()
}

/// Writes `data` to `path` and fsyncs it.
fn write_synced(path: &Path, data: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()?;
    Ok(())
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(files_under(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

/// The forms a 32-byte key could be written in: raw, hex, base64.
fn forms(key: &[u8]) -> Vec<Vec<u8>> {
    use base64::Engine;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    vec![
        key.to_vec(),
        hex.into_bytes(),
        base64::engine::general_purpose::STANDARD
            .encode(key)
            .into_bytes(),
    ]
}

/// Fails when any form of `key` is in `haystack` (named `place`).
fn refute_key(place: &str, haystack: &[u8], key: &[u8], which: &str) -> Result<()> {
    for form in forms(key) {
        if haystack.windows(form.len()).any(|w| w == form.as_slice()) {
            return Err(format!("{which} found in {place}").into());
        }
    }
    Ok(())
}

/// Kills the agent and leaves the storage side as a power cycle does: the
/// kernel target empty and the key of `dataset` unloaded (its device gone).
fn power_off(b: &mut Bench, dataset: &str) -> Result<()> {
    b.agent_process.kill()?;
    empty_kernel_targets()?;
    if zfs_get(dataset, "keystatus")? == "available" {
        unload_zfs_key(dataset)?;
    }
    run("udevadm", &["settle"])?;
    assert_eq!(zfs_get(dataset, "keystatus")?, "unavailable");
    Ok(())
}

/// Starts the agent again with `kek_args` as its key-encryption key flags.
async fn power_on(b: &mut Bench, kek_args: Vec<String>) -> Result<()> {
    b.agent_process.config_mut().extra_args = kek_args;
    b.agent_process.restart().await?;
    b.agent = b.agent_process.client().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn encryption_agent_reboot_brings_keys_back_without_a_person_and_leaks_none() -> Result<()> {
    let (kek_path, kek_bytes) = key_encryption_key_file(&Lab::get(), "kek")?;
    let mut b = Bench::with_agent_args("enc", key_encryption_key_args(&kek_path)).await?;
    let kek = Kek::from_bytes(&kek_bytes).map_err(|n| format!("KEK of {n} bytes"))?;

    // Made encrypted, under a key of its own sealed into the zvol.
    let v = b.encrypted_zvol(NVME, 64 << 20).await?;
    let ds = b.dataset(&v.id);
    assert_eq!(zfs_get(&ds, "encryption")?, "aes-256-gcm");
    assert_eq!(zfs_get(&ds, "keyformat")?, "raw");
    assert_eq!(zfs_get(&ds, "keystatus")?, "available");
    assert_eq!(zfs_get(&ds, "encryptionroot")?, ds);
    let sealed = zfs_get(&ds, PROPERTY)?;
    assert!(
        sealed.starts_with(&format!("v1:{}:", kek.id())),
        "{PROPERTY} = {sealed}"
    );
    let volume_key = kek.open(&sealed)?;

    // Staged over NVMe/TCP, written.
    let mut n = b.plugin.node().await?;
    let staging = b.path("staging");
    n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await?;
    let (before, after) = (pattern(7, 1 << 20), pattern(8, 64 << 10));
    write_synced(&staging.join("before"), &before)?;

    // The reboot, with its timeline.
    let t0 = Instant::now();
    power_off(&mut b, &ds)?;
    let off = t0.elapsed();
    assert!(!exported(&v.context["target"]));
    tokio::time::sleep(DOWN).await;
    power_on(&mut b, key_encryption_key_args(&kek_path)).await?;
    let answered = t0.elapsed();
    assert_eq!(zfs_get(&ds, "keystatus")?, "available");
    assert!(exported(&v.context["target"]), "{}", b.agent_process.log());
    let path = staging.join("after");
    let data = after.clone();
    tokio::time::timeout(
        RESUME_BOUND,
        tokio::task::spawn_blocking(move || write_synced(&path, &data)),
    )
    .await
    .map_err(|_| "the host's write after the reboot is still held")???;
    let resumed = t0.elapsed();
    fs::write("/proc/sys/vm/drop_caches", "3")?;
    assert_eq!(fs::read(staging.join("before"))?, before);
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    b.unexport(&v).await?;
    let witness = b.path("witness");
    fs::create_dir_all(&witness)?;
    let dev = v.device.display().to_string();
    run("mount", &["-o", "ro", &dev, &witness.display().to_string()])?;
    let read = (
        fs::read(witness.join("before")),
        fs::read(witness.join("after")),
    );
    run("umount", &[&witness.display().to_string()])?;
    assert_eq!(read.0?, before, "the data written before the reboot");
    assert_eq!(read.1?, after, "the data written after it");
    let line = format!(
        "encrypted reboot: agent killed, target emptied, key unloaded {:.1} s; agent answering (key loaded, export back) {:.1} s; host's fsync after the reboot returned {:.1} s (down {} s)",
        off.as_secs_f64(),
        answered.as_secs_f64(),
        resumed.as_secs_f64(),
        DOWN.as_secs()
    );
    println!("{line}");
    measured(&b.lab, &line)?;

    // A restore or a clone shares its source's key; a plain source makes
    // no encrypted copy.
    let clone_id = format!("{}/{}", b.lab.pool, b.lab.unique("clone"));
    let clone_uid = b.lab.unique("clone-uid");
    b.agent
        .create_volume(pb::CreateVolumeRequest {
            volume_id: clone_id.clone(),
            backend_type: ZVOL,
            capacity_bytes: 64 << 20,
            fence: fence(&clone_uid, 1),
            source_volume_id: v.id.clone(),
            ..Default::default()
        })
        .await?;
    let clone_ds = b.dataset(&clone_id);
    assert_eq!(zfs_get(&clone_ds, "encryptionroot")?, ds);
    assert_eq!(zfs_get(&clone_ds, "keystatus")?, "available");
    b.agent
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: clone_id.clone(),
            backend_type: ZVOL,
            fence: fence(&clone_uid, 1),
        })
        .await?;
    let plain = b.volume(ZVOL, NVME, 16 << 20).await?;
    let refused = b
        .agent
        .create_volume(pb::CreateVolumeRequest {
            volume_id: format!("{}/{}", b.lab.pool, b.lab.unique("copy")),
            backend_type: ZVOL,
            capacity_bytes: 16 << 20,
            fence: fence(&b.lab.unique("copy-uid"), 1),
            source_volume_id: plain.id.clone(),
            encrypted: true,
            ..Default::default()
        })
        .await
        .expect_err("an encrypted copy of a plain volume");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("is not encrypted"),
        "{}",
        refused.message()
    );
    b.delete(&plain).await?;
    for (request, code, text) in [
        (
            pb::CreateVolumeRequest {
                volume_id: format!("{}/{}", b.lab.vg, b.lab.unique("lv")),
                backend_type: LVM,
                lvm_provisioning: pb::LvmProvisioning::Thin as i32,
                encrypted: true,
                ..Default::default()
            },
            Code::InvalidArgument,
            "LVM volumes are not encrypted",
        ),
        (
            pb::CreateVolumeRequest {
                volume_id: format!("{}/{}", b.lab.pool, b.lab.unique("forged")),
                backend_type: ZVOL,
                zfs_properties: [(PROPERTY.to_owned(), sealed.clone())].into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "cannot be set",
        ),
    ] {
        let mut request = request;
        request.capacity_bytes = 16 << 20;
        request.fence = fence(&b.lab.unique("refused"), 1);
        let e = b.agent.create_volume(request).await.expect_err("refused");
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(text), "{}", e.message());
    }

    // A key that cannot be opened keeps the volume unexported, and the
    // log says why: no key-encryption key, then another one.
    b.export(&v).await?;
    let (other_path, _) = key_encryption_key_file(&b.lab, "other-kek")?;
    let other = Kek::load(&other_path)?;
    for (args, why) in [
        (
            Vec::new(),
            "this agent has no key-encryption key".to_owned(),
        ),
        (
            key_encryption_key_args(&other_path),
            format!(
                "sealed under key-encryption key {}, but this agent has {}",
                kek.id(),
                other.id()
            ),
        ),
    ] {
        let without = args.is_empty();
        power_off(&mut b, &ds)?;
        power_on(&mut b, args).await?;
        assert!(!exported(&v.context["target"]), "half-exported");
        assert_eq!(zfs_get(&ds, "keystatus")?, "unavailable");
        assert!(b.agent_process.log().contains(&why), "{why}");
        if without {
            let e = b
                .agent
                .create_volume(pb::CreateVolumeRequest {
                    volume_id: format!("{}/{}", b.lab.pool, b.lab.unique("nokek")),
                    backend_type: ZVOL,
                    capacity_bytes: 16 << 20,
                    fence: fence(&b.lab.unique("nokek-uid"), 1),
                    encrypted: true,
                    ..Default::default()
                })
                .await
                .expect_err("encryption without a key-encryption key");
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert!(
                e.message().contains("no key-encryption key"),
                "{}",
                e.message()
            );
        }
    }
    power_on(&mut b, key_encryption_key_args(&kek_path)).await?;
    assert!(exported(&v.context["target"]));

    // A rotation of the key-encryption key: given the new one and the old
    // one as the previous, the agent seals the zvol's key again under the
    // new one at start (the volume key and the data unchanged); then the
    // new one alone opens it after a reboot.
    let (new_path, new_bytes) = key_encryption_key_file(&b.lab, "new-kek")?;
    let new = Kek::load(&new_path)?;
    let mut rotating = key_encryption_key_args(&new_path);
    rotating.extend([
        "--previous-key-encryption-key-file".to_owned(),
        kek_path.display().to_string(),
    ]);
    power_off(&mut b, &ds)?;
    power_on(&mut b, rotating).await?;
    assert!(exported(&v.context["target"]), "{}", b.agent_process.log());
    let resealed = zfs_get(&ds, PROPERTY)?;
    assert!(
        resealed.starts_with(&format!("v1:{}:", new.id())),
        "{PROPERTY} = {resealed}"
    );
    assert_eq!(new.open(&resealed)?.bytes(), volume_key.bytes());
    power_off(&mut b, &ds)?;
    power_on(&mut b, key_encryption_key_args(&new_path)).await?;
    assert!(exported(&v.context["target"]), "{}", b.agent_process.log());
    assert_eq!(zfs_get(&ds, "keystatus")?, "available");
    println!(
        "rotation: the key sealed under {} is sealed under {}; the new KEK alone opens it",
        kek.id(),
        new.id()
    );

    // No key in clear anywhere the agent writes or shows.
    let state_dir = b.agent_process.config().state_dir.clone();
    let mut places: Vec<(String, Vec<u8>)> = Vec::new();
    for file in files_under(&state_dir)? {
        places.push((file.display().to_string(), fs::read(&file)?));
    }
    places.push(("the agent's log".into(), b.agent_process.log().into_bytes()));
    let pid = b.agent_process.pid().ok_or("the agent runs")?;
    for what in ["cmdline", "environ"] {
        places.push((
            format!("/proc/{pid}/{what}"),
            fs::read(format!("/proc/{pid}/{what}"))?,
        ));
    }
    for (place, bytes) in &places {
        refute_key(place, bytes, volume_key.bytes(), "the volume's key")?;
        refute_key(place, bytes, &kek_bytes, "the key-encryption key")?;
        refute_key(place, bytes, &new_bytes, "the new key-encryption key")?;
    }
    println!(
        "no key in {} places: the state folder's files, the log, the command line, the environment",
        places.len()
    );

    b.delete(&v).await?;
    assert!(
        run("zfs", &["list", "-H", &ds]).is_err(),
        "the zvol, and its sealed key with it, is gone"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn encryption_agent_volume_key_change_keeps_the_data_and_survives_a_crash_at_each_step(
) -> Result<()> {
    let (kek_path, kek_bytes) = key_encryption_key_file(&Lab::get(), "change-kek")?;
    let kek = Kek::from_bytes(&kek_bytes).map_err(|n| format!("KEK of {n} bytes"))?;
    let kek_args = key_encryption_key_args(&kek_path);
    let mut b = Bench::with_agent_args("chg", kek_args.clone()).await?;
    let v = b.encrypted_zvol(NVME, 16 << 20).await?;
    let ds = b.dataset(&v.id);
    let name = sys::zfs::DatasetName::new(&ds)?;
    let zfs = sys::zfs::Zfs::open()?;
    let data = pattern(9, 1 << 20);
    write_synced(&v.device, &data)?;
    let first = zfs_get(&ds, PROPERTY)?;
    let first_key = kek.open(&first)?;
    // A second one not exported, its key not loaded, as a reboot leaves
    // a volume no node uses.
    let idle = b.encrypted_zvol(NVME, 16 << 20).await?;
    b.unexport(&idle).await?;
    let idle_ds = b.dataset(&idle.id);
    unload_zfs_key(&idle_ds)?;
    let idle_first = zfs_get(&idle_ds, PROPERTY)?;
    let reads_back = |what: &str| -> Result<()> {
        let mut read = vec![0u8; data.len()];
        std::io::Read::read_exact(&mut fs::File::open(&v.device)?, &mut read)?;
        assert!(read == data, "{what}: the data changed");
        Ok(())
    };

    // The whole change, asked at start: a new key opens the zvol, the old
    // one no longer does, and the data is as it was.
    let mut changing = kek_args.clone();
    changing.push("--change-volume-keys".to_owned());
    power_off(&mut b, &ds)?;
    power_on(&mut b, changing).await?;
    let log = b.agent_process.log();
    assert!(
        log.contains("encrypted volumes given a new key of their own"),
        "{log}"
    );
    assert!(exported(&v.context["target"]), "{log}");
    let second = zfs_get(&ds, PROPERTY)?;
    assert_ne!(second, first);
    assert_eq!(zfs_get(&ds, NEXT_PROPERTY)?, "-");
    let second_key = kek.open(&second)?;
    assert_ne!(second_key.bytes(), first_key.bytes());
    zfs.check_key(&name, &second_key)?;
    assert!(
        matches!(
            zfs.check_key(&name, &first_key),
            Err(sys::zfs::Error::WrongKey { .. })
        ),
        "the old key still opens the zvol"
    );
    reads_back("after the change")?;
    let idle_second = zfs_get(&idle_ds, PROPERTY)?;
    assert_ne!(
        idle_second, idle_first,
        "the idle volume's key was not changed"
    );
    assert_eq!(
        zfs_get(&idle_ds, "keystatus")?,
        "unavailable",
        "the idle volume's key was left loaded"
    );
    zfs.check_key(
        &sys::zfs::DatasetName::new(&idle_ds)?,
        &kek.open(&idle_second)?,
    )?;
    println!("key change: the new key opens the zvol, the old one does not, the data is unchanged");

    // Interrupted after its first step (the new key sealed aside, the key
    // not changed): the next start keeps the key that opens the zvol.
    let stray = sys::zfs::RawKey::from_slice(&random_key()?).ok_or("32 bytes")?;
    run(
        "zfs",
        &[
            "set",
            &format!("{NEXT_PROPERTY}={}", kek.seal(&stray)?),
            &ds,
        ],
    )?;
    power_off(&mut b, &ds)?;
    power_on(&mut b, kek_args.clone()).await?;
    let log = b.agent_process.log();
    assert!(
        log.contains("an interrupted change of its key was not made"),
        "{log}"
    );
    assert!(exported(&v.context["target"]), "{log}");
    assert_eq!(zfs_get(&ds, PROPERTY)?, second);
    assert_eq!(zfs_get(&ds, NEXT_PROPERTY)?, "-");
    reads_back("after a change interrupted before the change")?;

    // Interrupted after its second step (the key changed, the new seal not
    // yet moved in): the next start finds that the new key opens it.
    let third_key = sys::zfs::RawKey::from_slice(&random_key()?).ok_or("32 bytes")?;
    let third = kek.seal(&third_key)?;
    run("zfs", &["set", &format!("{NEXT_PROPERTY}={third}"), &ds])?;
    zfs.change_key(&name, &third_key)?;
    power_off(&mut b, &ds)?;
    power_on(&mut b, kek_args).await?;
    let log = b.agent_process.log();
    assert!(
        log.contains("an interrupted change of its key was made"),
        "{log}"
    );
    assert!(exported(&v.context["target"]), "{log}");
    assert_eq!(zfs_get(&ds, PROPERTY)?, third);
    assert_eq!(zfs_get(&ds, NEXT_PROPERTY)?, "-");
    reads_back("after a change interrupted after the change")?;
    println!("key change interrupted after each step: the key that opens the zvol is kept, the data is unchanged");

    // No key in clear in the log or the state folder.
    let state_dir = b.agent_process.config().state_dir.clone();
    let mut places = vec![(
        "the agent's log".to_owned(),
        b.agent_process.log().into_bytes(),
    )];
    for file in files_under(&state_dir)? {
        places.push((file.display().to_string(), fs::read(&file)?));
    }
    for (place, bytes) in &places {
        for (key, which) in [
            (&second_key, "the changed key"),
            (&third_key, "the key of the interrupted change"),
        ] {
            refute_key(place, bytes, key.bytes(), which)?;
        }
    }
    b.delete(&v).await?;
    b.delete(&idle).await?;
    Ok(())
}

/// 32 random bytes.
fn random_key() -> Result<Vec<u8>> {
    use std::io::Read;
    let mut key = vec![0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(key)
}

/// The properties set on `dataset` itself (`zfs get -s local`) and its
/// key status: what an import must leave as it found.
fn own_properties(dataset: &str) -> Result<String> {
    Ok(format!(
        "{}keystatus {}",
        run(
            "zfs",
            &[
                "get",
                "-H",
                "-o",
                "property,value",
                "-s",
                "local",
                "all",
                dataset
            ]
        )?,
        zfs_get(dataset, "keystatus")?
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn encryption_agent_import_checks_the_key_changes_nothing_when_refused_and_reloads_it_after_a_reboot(
) -> Result<()> {
    let (kek_path, kek_bytes) = key_encryption_key_file(&Lab::get(), "import-kek")?;
    let mut b = Bench::with_agent_args("encimp", key_encryption_key_args(&kek_path)).await?;
    let size: u64 = 32 << 20;

    // What another tool left: a zvol encrypted under a raw key file of its
    // own, written, then its key unloaded (as after a reboot); beside it a
    // zvol under a passphrase and a plain one.
    let key = random_key()?;
    let key_file = b.path("legacy.key");
    write_synced(&key_file, &key)?;
    let made = |what: &str| {
        let id = format!("{}/{}", b.lab.pool, b.lab.unique(what));
        let ds = b.dataset(&id);
        (id, ds)
    };
    let (id, ds) = made("legacy");
    let (pass_id, pass_ds) = made("pass");
    let (plain_id, plain_ds) = made("plain");
    let pass_file = b.path("legacy.pass");
    write_synced(&pass_file, b"a passphrase of some length\n")?;
    let size_arg = size.to_string();
    for (dataset, options) in [
        (
            &ds,
            vec![
                "keyformat=raw".to_owned(),
                format!("keylocation=file://{}", key_file.display()),
            ],
        ),
        (
            &pass_ds,
            vec![
                "keyformat=passphrase".to_owned(),
                format!("keylocation=file://{}", pass_file.display()),
            ],
        ),
        (&plain_ds, vec![]),
    ] {
        let mut args = vec!["create", "-V", &size_arg];
        if !options.is_empty() {
            args.extend(["-o", "encryption=aes-256-gcm"]);
        }
        for o in &options {
            args.extend(["-o", o.as_str()]);
        }
        args.push(dataset.as_str());
        run("zfs", &args)?;
    }
    run("udevadm", &["settle"])?;
    let data = pattern(31, 1 << 20);
    let device = PathBuf::from(format!("/dev/zvol/{ds}"));
    {
        let mut f = fs::OpenOptions::new().write(true).open(&device)?;
        f.write_all(&data)?;
        f.sync_all()?;
    }
    unload_zfs_key(&ds)?;
    run("udevadm", &["settle"])?;
    let found = own_properties(&ds)?;
    assert!(found.ends_with("keystatus unavailable"), "{found}");

    let hex = |k: &[u8]| -> Vec<u8> {
        k.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into_bytes()
    };
    let uid = b.lab.unique("import-uid");
    let import = |id: &str, ds: &str, key: Vec<u8>| pb::CreateVolumeRequest {
        volume_id: id.to_owned(),
        backend_type: ZVOL,
        capacity_bytes: size,
        fence: fence(&uid, 1),
        import_zvol: ds.to_owned(),
        import_zvol_key: key,
        ..Default::default()
    };
    // The refusals: each changes nothing on the zvol and keeps nothing.
    let keys_dir = b.agent_process.config().state_dir.join("keys");
    for (request, text) in [
        (
            import(&id, &ds, Vec::new()),
            format!("import of volume {id} refused: key missing: zvol {ds} is encrypted and no key was given"),
        ),
        (
            import(&id, &ds, hex(&random_key()?)),
            format!("import of volume {id} refused: wrong key: the key given does not open zvol {ds}; nothing was loaded or changed"),
        ),
        (
            import(&id, &ds, key[..31].to_vec()),
            format!("import of volume {id} refused: wrong key: the key given for zvol {ds} is neither 32 bytes nor 64 hexadecimal digits"),
        ),
        (
            import(&pass_id, &pass_ds, hex(&key)),
            format!("import of volume {pass_id} refused: key format not supported: zvol {pass_ds} has keyformat=passphrase"),
        ),
        (
            import(&plain_id, &plain_ds, hex(&key)),
            format!("import of volume {plain_id} refused: not encrypted: zvol {plain_ds} is not encrypted, and a key was given for it"),
        ),
    ] {
        let e = b.agent.create_volume(request).await.expect_err("refused");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().starts_with(&text), "{}\nwanted: {text}", e.message());
        println!("refused: {}", e.message());
        assert_eq!(own_properties(&ds)?, found, "a refused import changed the zvol");
        assert!(!keys_dir.exists(), "a refused import kept a key");
    }

    // The key as a Secret carries it (hexadecimal, a newline after it):
    // checked, loaded, kept sealed in the state folder; the zvol gets no
    // property, and its data reads.
    let mut secret = hex(&key);
    secret.push(b'\n');
    b.agent.create_volume(import(&id, &ds, secret)).await?;
    let after = own_properties(&ds)?;
    assert_eq!(
        after,
        found.replace("keystatus unavailable", "keystatus available"),
        "the import loaded the key and changed nothing else"
    );
    let guid = zfs_get(&ds, "guid")?;
    let kept = files_under(&keys_dir)?;
    assert_eq!(kept, vec![keys_dir.join(format!("{guid}.sealed-key"))]);
    let mut head = vec![0u8; data.len()];
    {
        use std::io::Read;
        fs::File::open(&device)?.read_exact(&mut head)?;
    }
    assert!(head == data, "the imported zvol's data");

    // Exported, then the storage side rebooted: the agent loads the key it
    // kept and exports the zvol again.
    let mut v = Volume {
        csi_id: format!("storage-1/nvmeof-tcp/zfs-zvol/{id}"),
        id: id.clone(),
        uid: uid.clone(),
        backend: ZVOL,
        protocol: NVME,
        device: device.clone(),
        context: Default::default(),
        chap: None,
    };
    v.context = b.export(&v).await?;
    power_off(&mut b, &ds)?;
    power_on(&mut b, key_encryption_key_args(&kek_path)).await?;
    assert!(exported(&v.context["target"]), "{}", b.agent_process.log());
    assert_eq!(zfs_get(&ds, "keystatus")?, "available");
    let mut again = vec![0u8; data.len()];
    {
        use std::io::Read;
        fs::File::open(&device)?.read_exact(&mut again)?;
    }
    assert!(again == data, "the data after the reboot");
    println!("imported zvol {ds} back after a reboot, its key loaded from the sealed copy");

    // No form of the zvol's key, or of the KEK, where the agent writes.
    let pid = b.agent_process.pid().ok_or("the agent runs")?;
    let mut places: Vec<(String, Vec<u8>)> = Vec::new();
    for file in files_under(&b.agent_process.config().state_dir)? {
        places.push((file.display().to_string(), fs::read(&file)?));
    }
    places.push(("the agent's log".into(), b.agent_process.log().into_bytes()));
    places.push((
        format!("/proc/{pid}/cmdline"),
        fs::read(format!("/proc/{pid}/cmdline"))?,
    ));
    for (place, bytes) in &places {
        refute_key(place, bytes, &key, "the imported zvol's key")?;
        refute_key(place, bytes, &kek_bytes, "the key-encryption key")?;
    }

    // Deleted: the zvol goes, then its sealed key.
    b.delete(&v).await?;
    assert!(
        run("zfs", &["list", "-H", &ds]).is_err(),
        "the zvol is destroyed"
    );
    assert!(
        files_under(&keys_dir)?.is_empty(),
        "its sealed key is forgotten"
    );
    for dataset in [&pass_ds, &plain_ds] {
        run("zfs", &["destroy", dataset])?;
    }
    Ok(())
}
