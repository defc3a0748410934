//! `pillar-csi controller` as the CSI sidecars meet it: the binary started
//! against a real kube-apiserver 1.20 as the controller's ServiceAccount,
//! dialled on its unix socket for the Identity and Controller services.
use pb::controller_service_capability::{rpc::Type as Rpc, Type as CapType};
use pb::{controller_client::ControllerClient, identity_client::IdentityClient};
use pillar_csi_lab::apiserver::ApiServer;
use pillar_csi_lab::csi::CsiProcess;
use pillar_csi_proto::csi::v1 as pb;

type Result<T = ()> = pillar_csi_lab::Result<T>;

#[tokio::test]
async fn the_controller_binary_serves_identity_and_controller_on_its_socket() -> Result {
    let server = ApiServer::start()?;
    server.install_chart_crds().await?;
    server.controller_client().await?;
    let dir = tempfile::tempdir()?;
    let args = [
        "controller".into(),
        "--kubeconfig".into(),
        server
            .kubeconfig_of("pillar-csi-controller")
            .into_os_string(),
        "--agent-insecure-plaintext".into(),
    ];
    let controller = CsiProcess::start(
        &args,
        &dir.path().join("csi.sock"),
        &dir.path().join("controller.log"),
        &[],
    )
    .await?;
    let channel = controller.channel().await?;

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
    assert_eq!(
        caps.capabilities,
        csi::identity::plugin_capabilities(csi::driver::Driver::Block)
    );

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
