//! iSCSI with CHAP: the agent exports a volume whose target requires CHAP
//! (TPG `authentication` on, the credentials on the node's ACL), and
//! NodeStageVolume logs in and mounts only with the right credentials in
//! its secrets (never the publish context, which is refused when it carries
//! them). Missing or wrong credentials are refused with PERMISSION_DENIED
//! naming what was wrong, and leave no session, no open-iscsi node record
//! and no staging record behind; after a login the secret is neither in the
//! node record nor in the plugin's log.
//!
//! Run with `tests/lab/run tests -- node_iscsi_chap`.
use pillar_csi_lab::{agent::pb, block::pattern, node_bed::*, Result};
use std::{fs, path::Path, process::Command};
use tonic::Code;

const USER: &str = "pillar-node";
const SECRET: &str = "chap-secret-1234";

/// Whether open-iscsi keeps a node record for target `iqn` (the
/// `iscsiadm -m node` witness).
fn node_record(iqn: &str) -> Result<bool> {
    let out = Command::new("iscsiadm")
        .args(["-m", "node", "-T", iqn])
        .output()?;
    Ok(out.status.success())
}

/// A configfs value of the LIO target `iqn`, TPG 1.
fn lio(iqn: &str, rel: &str) -> Result<String> {
    let path = Path::new("/sys/kernel/config/target/iscsi")
        .join(iqn)
        .join("tpgt_1")
        .join(rel);
    Ok(fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .trim()
        .to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_iscsi_chap_stage_needs_the_right_credentials() -> Result<()> {
    let mut b = Bench::new("node-chap").await?;
    let mut n = b.plugin.node().await?;
    let chap = pb::IscsiChap {
        username: USER.into(),
        password: SECRET.into(),
    };
    let v = b
        .volume_with_chap(ZVOL, ISCSI, 64 << 20, Some(chap))
        .await?;
    let iqn = v.context["target"].clone();
    // The kernel's side: CHAP required, the credentials on the node's ACL.
    assert_eq!(lio(&iqn, "attrib/authentication")?, "1");
    assert_eq!(lio(&iqn, &format!("acls/{}/auth/userid", b.iqn))?, USER);
    let staging = b.path("staging");
    let with_secrets = |v: &Volume, user: &str, secret: &str| {
        let mut req = stage_req(v, &staging, mount_cap("ext4"));
        req.secrets = [
            ("chapUsername".to_owned(), user.to_owned()),
            ("chapPassword".to_owned(), secret.to_owned()),
        ]
        .into();
        req
    };

    // CHAP in the publish context (stored in the VolumeAttachment) is
    // refused, naming the key, never the secret.
    let mut leaky = stage_req(&v, &staging, mount_cap("ext4"));
    leaky
        .publish_context
        .insert("chapPassword".into(), SECRET.into());
    let e = n
        .node_stage_volume(leaky)
        .await
        .expect_err("CHAP in the publish context is refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(
        e.message().contains("chapPassword") && !e.message().contains(SECRET),
        "{e}"
    );

    // No credentials.
    let e = n
        .node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await
        .expect_err("a login without CHAP is refused");
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(
        e.message().contains("requires CHAP") && e.message().contains("chapUsername"),
        "{e}"
    );
    // Wrong credentials.
    let e = n
        .node_stage_volume(with_secrets(&v, USER, "wrong-secret-999"))
        .await
        .expect_err("a login with the wrong secret is refused");
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(
        e.message()
            .contains(&format!("refused the CHAP credentials of user \"{USER}\"")),
        "{e}"
    );
    assert!(
        !e.message().contains("wrong-secret-999"),
        "no secret in {e}"
    );
    // Neither refusal left anything behind.
    assert!(!iscsi_session(&iqn), "no session after a refused login");
    assert!(
        !node_record(&iqn)?,
        "no open-iscsi node record (it held the secret)"
    );
    assert_eq!(records(&b.plugin.state_dir)?, 0, "no staging record left");
    assert_eq!(mounted(&staging)?, None);

    // The right credentials: logged in, formatted, mounted, writable.
    n.node_stage_volume(with_secrets(&v, USER, SECRET)).await?;
    assert!(iscsi_session(&iqn), "logged in with CHAP");
    // The secret rested on disk only during the login.
    let show = Command::new("grep")
        .args(["-rl", SECRET, "/etc/iscsi/nodes"])
        .output()?;
    assert!(
        show.stdout.is_empty(),
        "the node record keeps no secret: {}",
        String::from_utf8_lossy(&show.stdout)
    );
    assert!(
        !b.plugin.log().contains(SECRET),
        "the plugin's log holds no secret"
    );
    let line = mounted(&staging)?.ok_or("nothing mounted at staging")?;
    assert!(line.contains(" - ext4 "), "{line}");
    let data = pattern(13, 256 << 10);
    fs::write(staging.join("f"), &data)?;
    assert_eq!(fs::read(staging.join("f"))?, data);
    for entry in fs::read_dir(&b.plugin.state_dir)? {
        let text = fs::read_to_string(entry?.path())?;
        assert!(
            !text.contains(SECRET),
            "the staging record holds no secret: {text}"
        );
    }
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert!(!iscsi_session(&iqn), "logged out after Unstage");
    assert_eq!(records(&b.plugin.state_dir)?, 0);
    b.delete(&v).await?;
    Ok(())
}
