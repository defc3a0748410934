//! What the lab tests that run the `pillar-csi agent` binary share: the
//! process on fixed NVMe/TCP and iSCSI ports, requests, refusals, the state
//! a refusal must leave unchanged, and the independent JSON client.
use super::*;
use pillar_csi_lab::agent::{pb, AgentConfig, AgentProcess};
use std::{
    fs,
    path::{Path, PathBuf},
};
use tonic::Code;

/// Reads file `name` from the filesystem on `dev`, mounted read-only for the read.
pub fn read_file_on(dev: &str, name: &str) -> String {
    let mnt = mkdir_tmp();
    sh(&format!("mount -o ro {dev} {}", mnt.display()));
    let text = fs::read_to_string(mnt.join(name));
    sh(&format!("umount {}", mnt.display()));
    text.unwrap()
}

/// NVMe/TCP and iSCSI ports of the agent processes: the same as the
/// end-to-end tests' (`tests/tests/agent_lab.rs`), so the agent's nvmet port
/// 1 always listens where it did before.
pub const GRPC_NVME_PORT: u16 = 4430;
pub const GRPC_ISCSI_PORT: u16 = 3270;
pub const LVM: i32 = pb::BackendType::Lvm as i32;

/// A plaintext agent process serving `backend` (`lvm=<vg>[/<thin>]`).
pub async fn agent_process(lab: &Lab, name: &str, backend: String) -> AgentProcess {
    let config = AgentConfig::new(
        lab,
        &lab.unique(name),
        vec![backend],
        GRPC_NVME_PORT,
        GRPC_ISCSI_PORT,
    )
    .unwrap();
    AgentProcess::start(config).await.unwrap()
}

pub fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.into(),
        generation,
    })
}

/// CreateVolume adopting `identity` under PreserveOriginal (the default).
pub fn import_request(identity: &LvIdentity, uid: &str) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        volume_id: format!("{}/{}", identity.vg, identity.lv),
        backend_type: LVM,
        capacity_bytes: 1 << 20,
        fence: fence(uid, 1),
        import_lv: Some(pb::LvmIdentity {
            volume_group: identity.vg.as_str().into(),
            logical_volume: identity.lv.as_str().into(),
            volume_group_uuid: identity.vg_uuid.as_str().into(),
            logical_volume_uuid: identity.lv_uuid.as_str().into(),
        }),
        ..Default::default()
    }
}

/// The message of a refusal, checked to be FAILED_PRECONDITION.
pub fn grpc_refusal<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> String {
    match r {
        Ok(v) => panic!("expected a refusal, the call succeeded: {:?}", v.get_ref()),
        Err(s) => {
            assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
            s.message().to_owned()
        }
    }
}

/// Appends an observed refusal to `refusals.txt` in the lab's work folder.
pub fn note(lab: &Lab, message: &str) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(lab.work.join("refusals.txt"))
        .unwrap();
    writeln!(f, "{message}").unwrap();
}

/// The agent's mark file for a volume ID.
pub fn mark_file(agent: &AgentProcess, id: &str) -> PathBuf {
    agent
        .config()
        .state_dir
        .join(format!("{}.mark.json", pillar_csi_agent::marks::encode(id)))
}

/// Everything a refused import must leave as it was: the agent's state
/// folder (names and bytes), the LV as lvs reports it (names, UUIDs,
/// attributes, size), the nvmet and LIO configfs trees, and the mounts.
#[derive(Debug, PartialEq)]
pub struct Unchanged {
    pub marks: Vec<(String, Vec<u8>)>,
    pub lv: String,
    pub nvmet: nvmet::State,
    pub lio: lio::State,
    pub mounts: String,
}

pub fn unchanged(agent: &AgentProcess, vg: &str, lv: &str) -> Unchanged {
    let mut marks = Vec::new();
    for entry in fs::read_dir(&agent.config().state_dir).unwrap() {
        let entry = entry.unwrap();
        marks.push((
            entry.file_name().to_string_lossy().into_owned(),
            fs::read(entry.path()).unwrap(),
        ));
    }
    marks.sort();
    Unchanged {
        marks,
        lv: sh(&format!(
            "lvs --noheadings --units b --nosuffix -o vg_name,lv_name,vg_uuid,lv_uuid,lv_attr,lv_size {vg}/{lv}"
        )),
        nvmet: nvmet::Nvmet::open().unwrap().read().unwrap(),
        lio: lio::Lio::open().unwrap().read().unwrap(),
        mounts: fs::read_to_string("/proc/self/mounts").unwrap(),
    }
}

/// Runs the independent JSON client `tests/lab/agent_json.py` (Python
/// grpcio, the repository's agent.proto compiled at run time into the lab's
/// work folder) against `agent` with `request` (proto3 JSON) on standard
/// input. Returns its exit status, standard output and standard error.
pub fn agent_json(lab: &Lab, agent: &AgentProcess, request: &str) -> (i32, String, String) {
    agent_json_call(lab, agent, "InspectVolume", request)
}

/// [`agent_json`] of any RPC `method`. Against an mTLS agent the client
/// presents the helper's client certificate, as grpcurl's `-cacert`,
/// `-cert`, `-key` and `-servername` do.
pub fn agent_json_call(
    lab: &Lab,
    agent: &AgentProcess,
    method: &str,
    request: &str,
) -> (i32, String, String) {
    use std::{
        io::Write,
        process::{Command, Stdio},
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = std::env::var("PILLAR_LAB_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(python)
        .arg(root.join("tests/lab/agent_json.py"))
        .arg(agent.addr().to_string())
        .arg(root.join("proto"))
        .arg(lab.work.join("agent_json.gen"))
        .arg(method)
        .envs(tls_env(agent))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (see scripts/deps.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// grpcurl's TLS flags for `agent_json.py`, as environment variables.
fn tls_env(agent: &AgentProcess) -> Vec<(&'static str, PathBuf)> {
    let Some((_, client)) = &agent.config().tls else {
        return Vec::new();
    };
    let mut env = vec![
        ("AGENT_JSON_CACERT", client.server_ca.clone()),
        (
            "AGENT_JSON_SERVERNAME",
            PathBuf::from(agent.addr().ip().to_string()),
        ),
    ];
    if let Some(id) = &client.identity {
        env.push(("AGENT_JSON_CERT", id.cert.clone()));
        env.push(("AGENT_JSON_KEY", id.key.clone()));
    }
    env
}
