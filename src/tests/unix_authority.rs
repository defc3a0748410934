//! The CSI endpoints answer whatever `:authority` a unix-socket client
//! sends (see `vendor/README.md` for why h2 is patched). For a socket
//! `/d/csi.sock`, the clients here send `%2Fd%2Fcsi.sock` (grpcurl 1.8.9
//! with `-unix`), `/d/csi.sock` (grpcurl `-authority`; grpc-java and
//! kubelets before kubernetes#112597 send it too), `unix:///d/csi.sock`
//! (csc, on grpc-go 1.19), `d%2Fcsi.sock` (Python grpc 1.85), `localhost`,
//! an empty value, or none. Each asks Identity/GetPluginInfo and must get
//! the plugin's name back:
//!
//! - `pillar-csi controller`, the real binary, with a kubeconfig whose API
//!   server does not exist: Identity needs nothing from it;
//! - `pillar-csi node`'s endpoint (`csi::endpoint::serve_node`) in the test
//!   process: the binary reads and, when missing, writes the initiator names
//!   in `/etc/nvme` and `/etc/iscsi` (no flag moves them, and
//!   `/etc/iscsi/initiatorname.iscsi` is root's alone), so here they are
//!   files in a temporary folder.
//!
//! The clients: grpcurl v1.8.9 and csc (gocsi v1.2.2) from
//! `~/.cache/pillar-csi/go-bin` (`make deps` installs them), Python's grpc
//! (`make deps` installs it), and [`raw_h2`], which sends exactly the
//! header fields it is given. A request malformed in another way (no
//! `:method`, no `:scheme`, an empty `:path`, a connection-specific field)
//! is still reset with PROTOCOL_ERROR.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod raw_h2;

use pillar_csi_lab::csi::CsiProcess;
use pillar_csi_proto::csi::v1::GetPluginInfoResponse;
use prost::Message;
use raw_h2::Outcome;
use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const DRIVER: &str = "pillar-csi.bhyoo.com";
const METHOD: &str = "/csi.v1.Identity/GetPluginInfo";

/// What one client got: the plugin name, or what it said instead.
type Answer = Result<String, String>;

/// A tool `make deps` installs into `~/.cache/pillar-csi/go-bin`.
fn go_bin(name: &str) -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let bin = cache.join("pillar-csi/go-bin").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `make deps` (scripts/deps.sh installs it there)",
        bin.display()
    );
    bin
}

/// Runs `cmd`; its standard output when it succeeds, else all it printed.
fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    Err(format!(
        "{}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// The plugin name in a GetPluginInfoResponse's bytes.
fn decoded(message: &[u8]) -> Answer {
    GetPluginInfoResponse::decode(message)
        .map(|r| r.name)
        .map_err(|e| format!("not a GetPluginInfoResponse ({e}): {message:02x?}"))
}

/// grpcurl with `-unix`, and `-authority` when given.
fn grpcurl(socket: &Path, authority: Option<&str>) -> Answer {
    let mut cmd = Command::new(go_bin("grpcurl"));
    cmd.args(["-plaintext", "-unix", "-max-time", "20"]);
    if let Some(a) = authority {
        cmd.arg("-authority").arg(a);
    }
    let json = output(
        cmd.arg("-import-path")
            .arg(Path::new(ROOT).join("proto/csi/v1"))
            .args(["-proto", "csi.proto"])
            .arg(socket)
            .arg(&METHOD[1..]),
    )?;
    let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| format!("{e}: {json}"))?;
    v["name"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no name in {json}"))
}

/// `csc identity plugin-info`, which prints `"<name>"\t"<version>"`.
fn csc(socket: &Path) -> Answer {
    let out = output(
        Command::new(go_bin("csc"))
            .args(["identity", "plugin-info", "--endpoint"])
            .arg(format!("unix://{}", socket.display())),
    )?;
    out.split_whitespace()
        .next()
        .map(|name| name.trim_matches('"').to_owned())
        .ok_or_else(|| format!("nothing printed: {out:?}"))
}

/// Python's grpc on `unix:<path>` with its default authority.
fn python_grpc(socket: &Path) -> Answer {
    const SCRIPT: &str = r#"
import sys
try:
    import grpc
except ImportError as e:
    sys.exit(f"python3 cannot import grpc ({e}): run `make deps`")
with grpc.insecure_channel(sys.argv[1]) as channel:
    ask = channel.unary_unary(sys.argv[2])
    sys.stdout.write(ask(b"", timeout=20).hex())
"#;
    let hex = output(
        Command::new("python3")
            .args(["-c", SCRIPT])
            .arg(format!("unix:{}", socket.display()))
            .arg(METHOD),
    )?;
    let bytes = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|e| format!("{e}: {hex}"))?;
    decoded(&bytes)
}

/// The header fields of a gRPC call of [`METHOD`] with `authority`, if any.
fn grpc_fields(authority: Option<&[u8]>) -> Vec<(&'static str, &[u8])> {
    let mut fields: Vec<(&str, &[u8])> = vec![
        (":method", b"POST"),
        (":scheme", b"http"),
        (":path", METHOD.as_bytes()),
    ];
    if let Some(a) = authority {
        fields.push((":authority", a));
    }
    fields.extend([
        ("content-type", &b"application/grpc"[..]),
        ("te", b"trailers"),
    ]);
    fields
}

/// An empty request message in gRPC's framing: not compressed, length 0.
const EMPTY_MESSAGE: [u8; 5] = [0; 5];

/// [`raw_h2::call`] with `fields`; the plugin name in the answer.
fn raw(socket: &Path, fields: &[(&str, &[u8])]) -> Answer {
    match raw_h2::call(socket, fields, &EMPTY_MESSAGE)? {
        Outcome::Reset(code) => Err(format!("stream reset with error code {code}")),
        Outcome::Answer(data) => {
            let len = data
                .get(1..5)
                .and_then(|b| b.try_into().ok())
                .map(|b| u32::from_be_bytes(b) as usize);
            match (data.first(), len) {
                (Some(0), Some(len)) if data.len() == 5 + len => decoded(&data[5..]),
                _ => Err(format!("no gRPC message in the answer: {data:02x?}")),
            }
        }
    }
}

/// Every client's answer on `socket`, each named by what it sends.
fn ask_every_client(socket: &Path) -> Vec<(String, Answer)> {
    let path = socket.as_os_str().as_encoded_bytes();
    vec![
        (
            "grpcurl -unix (the path percent-encoded)".into(),
            grpcurl(socket, None),
        ),
        (
            "grpcurl -authority <socket path>".into(),
            grpcurl(socket, socket.to_str()),
        ),
        (
            "grpcurl -authority localhost".into(),
            grpcurl(socket, Some("localhost")),
        ),
        ("csc (the endpoint URL unix://<path>)".into(), csc(socket)),
        (
            "python grpc (the path percent-encoded, less its first /)".into(),
            python_grpc(socket),
        ),
        (
            "raw :authority <socket path>".into(),
            raw(socket, &grpc_fields(Some(path))),
        ),
        (
            "raw :authority localhost".into(),
            raw(socket, &grpc_fields(Some(b"localhost"))),
        ),
        (
            "raw :authority \"\"".into(),
            raw(socket, &grpc_fields(Some(b""))),
        ),
        (
            "raw without :authority".into(),
            raw(socket, &grpc_fields(None)),
        ),
    ]
}

/// Asserts that every client got the driver's name, listing each one.
fn assert_all_answered(endpoint: &str, answers: &[(String, Answer)]) {
    let mut failed = 0;
    for (client, answer) in answers {
        match answer {
            Ok(name) if name == DRIVER => eprintln!("{endpoint}: {client}: {name}"),
            other => {
                failed += 1;
                eprintln!("{endpoint}: {client}: FAILED: {other:?}");
            }
        }
    }
    assert_eq!(failed, 0, "{endpoint}: {failed} client(s) got no answer");
}

/// A kubeconfig for an API server that does not exist (nothing listens on
/// port 1): the controller starts and serves its socket; its reconcilers
/// log that they cannot reach the server.
fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
    let file = dir.join("kubeconfig");
    std::fs::write(
        &file,
        "apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: 'https://127.0.0.1:1'}
users:
- name: nobody
  user: {token: none}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: nobody}
current-context: nowhere
",
    )
    .unwrap();
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn the_controller_binary_answers_every_unix_socket_authority() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let args: [OsString; 4] = [
        "controller".into(),
        "--kubeconfig".into(),
        unreachable_kubeconfig(dir.path()).into(),
        "--agent-insecure-plaintext".into(),
    ];
    let controller = CsiProcess::start(&args, &socket, &dir.path().join("controller.log"), &[])
        .await
        .unwrap();
    let answers = tokio::task::spawn_blocking(move || ask_every_client(&socket))
        .await
        .unwrap();
    assert_all_answered("controller", &answers);
    drop(controller);
}

/// The node plugin's endpoint serving in this process, on a runtime of its
/// own (dropped with it), the node's initiator names in `dir`.
fn serve_node(dir: &Path) -> (tokio::runtime::Runtime, PathBuf) {
    use csi::node::{Node, NodeConfig};
    let mut config = NodeConfig::new("authority-test");
    config.state_dir = dir.join("state");
    config.host_nqn_file = dir.join("hostnqn");
    config.host_id_file = dir.join("hostid");
    config.initiator_name_file = dir.join("initiatorname.iscsi");
    let node = Arc::new(Node::new(config).unwrap());
    let socket = dir.join("csi.sock");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let serving =
        runtime.spawn({
            let socket = socket.clone();
            async move {
                csi::endpoint::serve_node(node, csi::driver::Driver::Block, "test", &socket).await
            }
        });
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(!serving.is_finished(), "serve_node ended: {serving:?}");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} is not served after 30 s",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (runtime, socket)
}

#[test]
fn the_node_endpoint_answers_every_unix_socket_authority() {
    let dir = tempfile::tempdir().unwrap();
    let (_runtime, socket) = serve_node(dir.path());
    assert_all_answered("node", &ask_every_client(&socket));
}

#[test]
fn requests_malformed_otherwise_are_still_reset() {
    let dir = tempfile::tempdir().unwrap();
    let (_runtime, socket) = serve_node(dir.path());
    let path = socket.as_os_str().as_encoded_bytes();
    let fields = grpc_fields(Some(path));
    let without = |name: &str| -> Vec<(&str, &[u8])> {
        fields.iter().filter(|(n, _)| *n != name).copied().collect()
    };
    let mut empty_path = fields.clone();
    empty_path[2] = (":path", b"");
    let mut connection = fields.clone();
    connection.push(("connection", b"close"));
    let malformed = [
        ("without :method", without(":method")),
        ("without :scheme", without(":scheme")),
        ("with an empty :path", empty_path),
        ("with a connection field", connection),
    ];
    for (what, fields) in malformed {
        let outcome = raw_h2::call(&socket, &fields, &EMPTY_MESSAGE).unwrap();
        eprintln!("node: request {what}: {outcome:?}");
        assert_eq!(
            outcome,
            Outcome::Reset(raw_h2::PROTOCOL_ERROR),
            "request {what}"
        );
    }
}
