//! `pillar-csi controller` as the CSI sidecars meet it: the binary started
//! against a real kube-apiserver 1.20 as the controller's ServiceAccount,
//! dialled on its unix socket for the Identity and Controller services.
use pb::controller_service_capability::{rpc::Type as Rpc, Type as CapType};
use pb::{controller_client::ControllerClient, identity_client::IdentityClient};
use pillar_csi_lab::agent::binary;
use pillar_csi_lab::apiserver::ApiServer;
use pillar_csi_proto::csi::v1 as pb;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

type Result<T = ()> = pillar_csi_lab::Result<T>;

/// The child process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn channel(socket: &Path, log: &Path, child: &mut Running) -> Result<Channel> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait()? {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("pillar-csi controller exited with {status}:\n{log}").into());
        }
        if socket.exists() {
            let connected = Endpoint::from_shared(format!("unix://{}", socket.display()))?
                .connect_timeout(Duration::from_secs(5))
                .connect()
                .await;
            if let Ok(c) = connected {
                return Ok(c);
            }
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err("the controller's socket did not answer within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_controller_binary_serves_identity_and_controller_on_its_socket() -> Result {
    let server = ApiServer::start()?;
    server.install_chart_crds().await?;
    server.controller_client().await?;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("csi.sock");
    let log = dir.path().join("controller.log");
    let mut child = Running(
        Command::new(binary()?)
            .arg("controller")
            .arg("--kubeconfig")
            .arg(server.kubeconfig_of("pillar-csi-controller"))
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--agent-insecure-plaintext")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?,
    );
    let channel = channel(&socket, &log, &mut child).await?;

    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await?
        .into_inner();
    assert_eq!(info.name, "pillar-csi.bhyoo.com");
    assert!(
        info.vendor_version.starts_with(env!("CARGO_PKG_VERSION")),
        "{}",
        info.vendor_version
    );
    let probe = identity.probe(pb::ProbeRequest {}).await?.into_inner();
    assert_eq!(probe.ready, Some(true));
    let caps = identity
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await?
        .into_inner();
    assert_eq!(caps.capabilities, csi::identity::plugin_capabilities());

    let rpcs: Vec<Rpc> = ControllerClient::new(channel)
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await?
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(CapType::Rpc(r)) => Rpc::try_from(r.r#type).ok(),
            None => None,
        })
        .collect();
    for wanted in [
        Rpc::CreateDeleteVolume,
        Rpc::PublishUnpublishVolume,
        Rpc::ExpandVolume,
    ] {
        assert!(rpcs.contains(&wanted), "{wanted:?} missing from {rpcs:?}");
    }
    Ok(())
}
