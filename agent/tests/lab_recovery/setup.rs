//! What the recovery lab tests share: one adopted LV served by an mTLS
//! agent with a trust anchor, the operator's steps (the independent JSON
//! client, `pillar-csi recovery inspect|sign|verify`, `rebind-check`) and
//! the controller's TransferVolumeOwnership call.
use crate::common::{grpc::*, *};
use api::annotations::LvIdentity;
use base64::{engine::general_purpose::STANDARD, Engine};
use pillar_csi_agent::{marks::FenceMark, recovery::Recovery};
use pillar_csi_lab::{
    agent::{binary, pb, AgentConfig, AgentProcess, ClientTls, ServerTls},
    env::Lab,
    tls::{Ca, Pem},
};
use prost::Message;
use serde_json::Value;
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};
use tonic::Code;

/// The lifecycle whose Kubernetes records were lost.
pub const OLD: &str = "uid-old-lifecycle";
/// The recovery record's UID: the new lifecycle.
pub const NEW: &str = "uid-new-lifecycle";

/// One adopted LV served by an mTLS agent with a trust anchor.
pub struct Setup {
    pub lab: Lab,
    pub agent: AgentProcess,
    pub vg: String,
    pub name: String,
    pub id: String,
    pub ident: LvIdentity,
    pub dir: PathBuf,
    /// The operator's private key (PKCS#8 PEM); its public half is the anchor.
    pub operator_key: PathBuf,
    /// The agent's server certificate and key (they sign snapshots).
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub anchor: PathBuf,
}

/// A key pair made with openssl: (private key, public key), PEM.
pub fn openssl_key(dir: &Path, name: &str, algorithm: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let opts = match algorithm {
        "ec" => "-algorithm EC -pkeyopt ec_paramgen_curve:prime256v1",
        _ => "-algorithm RSA -pkeyopt rsa_keygen_bits:2048",
    };
    sh(&format!(
        "openssl genpkey {opts} -out {k} 2>/dev/null && openssl pkey -in {k} -pubout -out {p}",
        k = key.display(),
        p = public.display()
    ));
    (key, public)
}

/// An LV with ext4 and a file, an mTLS agent with the operator's public
/// key as trust anchor, the LV adopted (PreserveOriginal) under `OLD` and
/// exported over NVMe/TCP to `HOST_NQN`: the state the lost PVC left.
pub async fn setup(prefix: &str) -> Setup {
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let name = lab.unique(prefix).replace('-', "_");
    sh(&format!("lvcreate -q -y -L 32M -n {name} {vg}"));
    settle();
    let dev = format!("/dev/{vg}/{name}");
    let mnt = mkdir_tmp();
    sh(&format!(
        "mkfs.ext4 -q {dev} && mount {dev} {m} && printf 'data before the loss\\n' > {m}/data.txt && umount {m}",
        m = mnt.display()
    ));
    let dir = lab.work.join(lab.unique("recovery-keys"));
    fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new(&dir, "recovery-ca").unwrap();
    let server = ca
        .server("storage-1", "127.0.0.1".parse().unwrap())
        .unwrap();
    let client = ca.client("operator").unwrap();
    let (operator_key, anchor) = openssl_key(&dir, "operator", "ec");
    let mut config = AgentConfig::new(
        &lab,
        &lab.unique(prefix),
        vec![format!("lvm={vg}")],
        GRPC_NVME_PORT,
        GRPC_ISCSI_PORT,
    )
    .unwrap();
    config.tls = Some((
        ServerTls {
            identity: server.clone(),
            client_ca: ca.pem.cert.clone(),
        },
        ClientTls {
            server_ca: ca.pem.cert.clone(),
            identity: Some(client),
        },
    ));
    config.extra_args = vec![
        "--recovery-trust-anchor".into(),
        anchor.display().to_string(),
    ];
    let agent = AgentProcess::start(config).await.unwrap();
    let id = format!("{vg}/{name}");
    let ident = lv_identity(&vg, &name);
    let mut c = agent.client().await.unwrap();
    c.create_volume(import_request(&ident, OLD)).await.unwrap();
    c.export_volume(pb::ExportVolumeRequest {
        volume_id: id.clone(),
        backend_type: LVM,
        protocol_type: pb::ProtocolType::NvmeofTcp as i32,
        fence: fence(OLD, 2),
        acl_enabled: true,
        allowed_initiators: vec![HOST_NQN.into()],
        chap: None,
    })
    .await
    .unwrap();
    Setup {
        lab,
        agent,
        vg,
        name,
        id,
        ident,
        dir,
        operator_key,
        server_cert: server.cert,
        server_key: server.key,
        anchor,
    }
}

/// One run of the `pillar-csi` binary.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `pillar-csi ARGS` (the binary the lab built).
pub fn pillar(args: &[String]) -> Run {
    let out = std::process::Command::new(binary().unwrap())
        .args(args)
        .output()
        .unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The agent flags of `recovery inspect` and `rebind-check` (grpcurl's
/// `-cacert`, `-cert`, `-key`): the agent at `addr`, trusted through `ca`,
/// called with the client certificate `client` (none: no --cert, --key).
pub fn agent_flags(addr: std::net::SocketAddr, ca: &Path, client: Option<&Pem>) -> Vec<String> {
    let mut flags = vec![
        "--agent".to_owned(),
        addr.to_string(),
        "--cacert".into(),
        ca.display().to_string(),
    ];
    if let Some(c) = client {
        flags.extend([
            "--cert".into(),
            c.cert.display().to_string(),
            "--key".into(),
            c.key.display().to_string(),
        ]);
    }
    flags
}

impl Setup {
    /// InspectVolume through the JSON client; the answer is kept as
    /// `<step>.inspect.json` (the file `recovery sign` reads).
    pub fn inspect(&self, step: &str) -> (PathBuf, Value) {
        let request = format!(
            r#"{{"volume_id": "{}", "backend_type": "BACKEND_TYPE_LVM"}}"#,
            self.id
        );
        let (status, out, err) = agent_json(&self.lab, &self.agent, &request);
        assert_eq!(status, 0, "agent_json.py failed: {err}");
        let path = self.dir.join(format!("{step}.inspect.json"));
        fs::write(&path, &out).unwrap();
        (path, serde_json::from_str(&out).unwrap())
    }

    /// The agent flags of this agent with the operator's client certificate.
    pub fn flags(&self) -> Vec<String> {
        let (_, client) = self.agent.config().tls.as_ref().unwrap();
        agent_flags(
            self.agent.addr(),
            &client.server_ca,
            client.identity.as_ref(),
        )
    }

    /// `pillar-csi recovery inspect` of a volume with extra arguments.
    pub fn inspect_cli_run(&self, volume_id: &str, extra: &[&str]) -> Run {
        let mut args = vec!["recovery".to_owned(), "inspect".into()];
        args.extend(self.flags());
        args.extend(["--volume-id".into(), volume_id.to_owned()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        pillar(&args)
    }

    /// InspectVolume through `pillar-csi recovery inspect`, kept as
    /// `<step>.inspect.json`.
    pub fn inspect_cli(&self, step: &str) -> (PathBuf, Value) {
        let run = self.inspect_cli_run(&self.id, &[]);
        assert!(run.ok, "recovery inspect: {run:?}");
        let path = self.dir.join(format!("{step}.inspect.json"));
        fs::write(&path, &run.stdout).unwrap();
        (path, serde_json::from_str(&run.stdout).unwrap())
    }

    /// Step 1 of the spec: UnexportVolume under the old lifecycle's token
    /// read from the inspection, through the JSON client.
    pub fn unexport_old(&self, inspected: &Value) {
        let (uid, generation) = token_of(inspected);
        let request = format!(
            r#"{{"volume_id": "{}", "protocol_type": "PROTOCOL_TYPE_NVMEOF_TCP",
 "fence": {{"volume_uid": "{uid}", "generation": "{generation}"}}}}"#,
            self.id
        );
        let (status, _, err) = agent_json_call(&self.lab, &self.agent, "UnexportVolume", &request);
        assert_eq!(status, 0, "UnexportVolume: {err}");
    }

    /// [`Setup::unexport_old`] through the agent's gRPC client (the tests
    /// of refusals and restarts, whose subject is not the JSON form).
    pub async fn unexport_old_grpc(&self, inspected: &Value) {
        let (uid, generation) = token_of(inspected);
        let mut c = self.agent.client().await.unwrap();
        c.unexport_volume(pb::UnexportVolumeRequest {
            volume_id: self.id.clone(),
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence(&uid, generation.parse().unwrap()),
        })
        .await
        .unwrap();
    }

    /// `pillar-csi recovery sign` over an inspection: (snapshot,
    /// authorization, authorizationDigest) as printed.
    pub fn sign(&self, inspect: &Path, key: &Path, generation: u64, now: Option<&str>) -> Signed {
        let mut args = vec![
            "recovery".to_owned(),
            "sign".into(),
            inspect.display().to_string(),
            key.display().to_string(),
            NEW.into(),
            generation.to_string(),
        ];
        if let Some(now) = now {
            args.extend(["--now".into(), now.into()]);
        }
        let run = pillar(&args);
        assert!(run.ok, "recovery sign: {}", run.stderr);
        Signed::parse(&run.stdout)
    }

    /// `pillar-csi recovery verify` of a snapshot and grant (base64) against
    /// this agent's trust anchor and server certificate.
    pub fn verify(&self, snapshot: &str, authorization: &str, now: Option<&str>) -> Run {
        let mut args: Vec<String> = [
            "recovery",
            "verify",
            "--trust-anchor",
            &self.anchor.display().to_string(),
            "--agent-cert",
            &self.server_cert.display().to_string(),
            "--snapshot",
            snapshot,
            "--authorization",
            authorization,
        ]
        .map(String::from)
        .into();
        if let Some(now) = now {
            args.extend(["--now".into(), now.into()]);
        }
        pillar(&args)
    }

    /// TransferVolumeOwnership as the controller calls it.
    pub async fn transfer(
        &self,
        signed: &Signed,
    ) -> Result<pb::TransferVolumeOwnershipResponse, tonic::Status> {
        let mut c = self.agent.client().await.unwrap();
        c.transfer_volume_ownership(signed.request(&self.id))
            .await
            .map(tonic::Response::into_inner)
    }

    /// The agent's mark of the volume.
    pub fn mark(&self) -> FenceMark {
        serde_json::from_slice(&fs::read(mark_file(&self.agent, &self.id)).unwrap()).unwrap()
    }

    /// The witnesses a refusal must leave as they were.
    pub fn unchanged(&self) -> Unchanged {
        unchanged(&self.agent, &self.vg, &self.name)
    }

    /// The LV's device.
    pub fn dev(&self) -> String {
        format!("/dev/{}/{}", self.vg, self.name)
    }
}

/// The fencing token of an inspection's `fence`: (UID, generation).
fn token_of(inspected: &Value) -> (String, String) {
    (
        inspected["fence"]["volumeUid"].as_str().unwrap().to_owned(),
        inspected["fence"]["generation"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

/// The three lines `recovery sign` prints.
#[derive(Debug, Clone)]
pub struct Signed {
    pub snapshot: String,
    pub authorization: String,
    pub digest: String,
}

impl Signed {
    /// Reads `recovery sign`'s output.
    pub fn parse(out: &str) -> Self {
        let line = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}: ")))
                .unwrap_or_else(|| panic!("no {key} in {out}"))
                .to_owned()
        };
        Self {
            snapshot: line("snapshot"),
            authorization: line("authorization"),
            digest: line("authorizationDigest"),
        }
    }

    /// The decoded grant.
    pub fn grant(&self) -> pb::RecoveryAuthorization {
        pb::RecoveryAuthorization::decode(STANDARD.decode(&self.authorization).unwrap().as_slice())
            .unwrap()
    }

    /// The decoded snapshot.
    pub fn snapshot(&self) -> pb::RecoverySnapshot {
        pb::RecoverySnapshot::decode(STANDARD.decode(&self.snapshot).unwrap().as_slice()).unwrap()
    }

    /// The controller's request.
    pub fn request(&self, id: &str) -> pb::TransferVolumeOwnershipRequest {
        pb::TransferVolumeOwnershipRequest {
            volume_id: id.into(),
            backend_type: LVM,
            snapshot: Some(self.snapshot()),
            authorization: Some(self.grant()),
        }
    }
}

/// The message of a FAILED_PRECONDITION refusal.
pub fn refusal<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> String {
    match r {
        Ok(v) => panic!("expected a refusal, the call succeeded: {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
            s.message().to_owned()
        }
    }
}

/// A snapshot taken 16 minutes ago: signed, as the agent signs, with the
/// agent's own server key (the test made it), dated back.
pub fn stale_snapshot(s: &Setup, fresh: &Path) -> PathBuf {
    let recovery = Recovery::load(&s.anchor, &s.server_cert, &s.server_key).unwrap();
    let text = fs::read_to_string(fresh).unwrap();
    let mut snapshot = pillar_csi_agent::recovery::json::snapshot_of_inspection(&text).unwrap();
    snapshot.issued_at = Some(prost_types::Timestamp::from(
        SystemTime::now() - Duration::from_secs(16 * 60),
    ));
    recovery.sign_snapshot(&mut snapshot).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["snapshot"]["issuedAt"] = Value::from(snapshot.issued_at.unwrap().to_string());
    v["snapshot"]["signature"] = Value::from(STANDARD.encode(&snapshot.signature));
    let path = s.dir.join("stale.inspect.json");
    fs::write(&path, v.to_string()).unwrap();
    path
}
