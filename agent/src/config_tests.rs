//! Tests of the agent's configuration (`config.rs`).
use super::*;

#[test]
fn yaml_in_the_helm_values_shape() -> Result<(), ConfigError> {
    let c = AgentConfig::from_yaml(
        "backends:\n  - zfs: {pool: tank, parentDataset: k8s}\n  - lvm: {volumeGroup: data-vg, thinPool: thin0}\n\
         listen: 0.0.0.0:9500\nstateDir: /var/lib/pillar-csi/agent\ninsecurePlaintext: true\n\
         nvmeof: {address: 10.0.0.1, port: 4420}\niscsi: {address: 10.0.0.1, port: 3260}\nresyncIntervalSeconds: 30\n",
    )?;
    assert_eq!(
        c.backends,
        vec![
            BackendConfig::Zfs {
                pool: "tank".into(),
                parent_dataset: Some("k8s".into())
            },
            BackendConfig::Lvm {
                volume_group: "data-vg".into(),
                thin_pool: Some("thin0".into())
            },
        ]
    );
    c.validate()?;
    assert!(AgentConfig::from_yaml("listen: 1.2.3.4:1\nbogus: 1\n").is_err());
    Ok(())
}

#[test]
fn keys_left_out_take_their_defaults() -> Result<(), ConfigError> {
    let d = AgentConfig::default();
    assert_eq!(AgentConfig::from_yaml("")?, d, "an empty file");
    let c = AgentConfig::from_yaml(
        "backends:\n  - zfs: {pool: tank}\ninsecurePlaintext: true\nnvmeof: {address: 10.0.0.5}\niscsi: {port: 3261}\n",
    )?;
    assert_eq!(c.listen, d.listen);
    assert_eq!(c.state_dir, d.state_dir);
    assert_eq!(c.resync_interval_seconds, d.resync_interval_seconds);
    assert_eq!(
        c.nvmeof,
        Listener {
            address: [10, 0, 0, 5].into(),
            port: 4420
        }
    );
    assert_eq!(
        c.iscsi,
        Listener {
            address: d.iscsi.address,
            port: 3261
        }
    );
    c.validate()?;
    let bad = AgentConfig::from_yaml("nvmeof: {address: 10.0.0.5, prot: 1}\n")
        .expect_err("unknown nested key");
    assert!(bad.to_string().contains("prot"), "{bad}");
    Ok(())
}

#[test]
fn backend_flags_replace_the_files_backends() -> Result<(), ConfigError> {
    let mut c = AgentConfig::from_yaml(
        "backends:\n  - zfs: {pool: tank, parentDataset: k8s}\n  - lvm: {volumeGroup: data-vg}\n",
    )?;
    let from_file = c.backends.clone();
    c.override_backends(&[])?;
    assert_eq!(c.backends, from_file, "no flag keeps the file's backends");
    c.override_backends(&["lvm=data-vg/thin0".into()])?;
    assert_eq!(
        c.backends,
        vec![BackendConfig::Lvm {
            volume_group: "data-vg".into(),
            thin_pool: Some("thin0".into())
        }],
        "a flag naming the file's VG again replaces it instead of repeating it"
    );
    c.insecure_plaintext = true;
    c.validate()?;
    let before = c.clone();
    let bad = c
        .override_backends(&["zfs=tank".into(), "nfs=x".into()])
        .expect_err("unknown kind");
    assert!(bad.to_string().contains("unknown kind \"nfs\""), "{bad}");
    assert_eq!(c, before, "a bad flag changes nothing");
    Ok(())
}

#[test]
fn half_valid_configurations_name_every_problem() {
    let mut c = AgentConfig::default();
    c.tls.cert = Some("/nonexistent/cert.pem".into());
    c.backends.push(BackendConfig::Zfs {
        pool: "../x".into(),
        parent_dataset: None,
    });
    c.backends.push(BackendConfig::Lvm {
        volume_group: "../x".into(),
        thin_pool: Some("a/b".into()),
    });
    let e = c.validate().expect_err("invalid").to_string();
    for part in [
        "\"../x\" is not a valid name",
        "configured twice",
        "TLS needs all three",
        "\"a/b\" is not a valid name",
    ] {
        assert!(e.contains(part), "{part}: {e}");
    }
    let mut c = AgentConfig::default();
    c.backends.push(BackendConfig::Zfs {
        pool: "tank".into(),
        parent_dataset: None,
    });
    assert!(c
        .validate()
        .expect_err("no tls")
        .to_string()
        .contains("--insecure-plaintext"));
    c.insecure_plaintext = true;
    assert!(c.validate().is_ok());
    c.backends.push(BackendConfig::ZfsDataset {
        pool: "tank".into(),
        parent_dataset: Some("files".into()),
    });
    assert!(c.validate().is_ok(), "one pool holds zvols and filesystems");
    c.backends.push(BackendConfig::ZfsDataset {
        pool: "tank".into(),
        parent_dataset: None,
    });
    let twice = c
        .validate()
        .expect_err("two filesystem backends of one pool");
    assert!(twice.to_string().contains("configured twice"), "{twice}");
    c.backends.truncate(1);
    c.name = Some("__".into());
    let e = c
        .validate()
        .expect_err("a name with nothing to name targets by");
    assert!(e.to_string().contains("agent name \"__\""), "{e}");
    c.name = Some("storage-1".into());
    assert!(c.validate().is_ok());
    let file = AgentConfig::from_yaml("name: storage-2\n").expect("name key");
    assert_eq!(file.name.as_deref(), Some("storage-2"));
}

#[test]
fn a_previous_key_encryption_key_needs_a_current_one() -> Result<(), ConfigError> {
    let mut c = AgentConfig::from_yaml(
        "backends:\n  - zfs: {pool: tank}\ninsecurePlaintext: true\npreviousKeyEncryptionKeyFile: /kek/old\n",
    )?;
    let e = c.validate().expect_err("previous alone").to_string();
    assert!(
        e.contains("--previous-key-encryption-key-file needs --key-encryption-key-file"),
        "{e}"
    );
    c.key_encryption_key_file = Some("/kek/new".into());
    c.validate()?;
    Ok(())
}

#[test]
fn a_change_of_volume_keys_needs_the_key_encryption_key() -> Result<(), ConfigError> {
    let mut c = AgentConfig::from_yaml(
        "backends:\n  - zfs: {pool: tank}\ninsecurePlaintext: true\nchangeVolumeKeys: true\n",
    )?;
    assert!(c.change_volume_keys);
    let e = c.validate().expect_err("no KEK").to_string();
    assert!(
        e.contains("--change-volume-keys needs --key-encryption-key-file"),
        "{e}"
    );
    c.key_encryption_key_file = Some("/kek/current".into());
    c.validate()?;
    assert!(!AgentConfig::from_yaml("insecurePlaintext: true\n")?.change_volume_keys);
    Ok(())
}

#[test]
fn directory_backends_name_an_absolute_path_and_a_name_of_their_own() -> Result<(), ConfigError> {
    let mut c = AgentConfig::from_yaml(
        "insecurePlaintext: true\nbackends:\n  - directory: {name: dirs, path: /srv/volumes}\n",
    )?;
    c.validate()?;
    assert_eq!(
        c.backends,
        vec![BackendConfig::Directory {
            name: "dirs".into(),
            path: "/srv/volumes".into()
        }]
    );
    c.override_backends(&["directory=files:/mnt/xfs/vols".into()])?;
    assert_eq!(
        c.backends,
        vec![BackendConfig::Directory {
            name: "files".into(),
            path: "/mnt/xfs/vols".into()
        }]
    );
    let before = c.clone();
    let bad = c
        .override_backends(&["directory=files".into()])
        .expect_err("no path");
    assert!(
        bad.to_string().contains("directory=<name>:<absolute path>"),
        "{bad}"
    );
    assert_eq!(c, before, "a bad flag changes nothing");
    c.backends = vec![
        BackendConfig::Directory {
            name: "tank".into(),
            path: "srv".into(),
        },
        BackendConfig::Zfs {
            pool: "tank".into(),
            parent_dataset: None,
        },
    ];
    let e = c
        .validate()
        .expect_err("relative path, name taken")
        .to_string();
    for part in ["path srv is not absolute", "configured twice"] {
        assert!(e.contains(part), "{part}: {e}");
    }
    Ok(())
}
