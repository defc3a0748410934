//! The Helm chart installed for real (issue 41): `helm install` of
//! `charts/pillar-csi` on a cluster of the real control plane, kube-proxy
//! and kubelet with containerd, the chart's images made offline from
//! Debian's packages and the build ([`pillar_csi_lab::chart_install`]).
//! The release's own Pods are the driver: the controller with the real
//! external-provisioner, -attacher, -resizer and -snapshotter (reaching
//! the API server through the `kubernetes` Service and kube-proxy, with the
//! ServiceAccount token kube-controller-manager signed), the node plugin
//! registered with kubelet, and the agent serving the lab's pool over
//! mTLS. A claim then lives its whole life with Pods through them
//! ([`pillar_csi_lab::pod_life`]), and `helm uninstall` leaves no Pod and
//! no registration behind.
//!
//! Stand-ins, in images of their own with the real flags: the
//! node-driver-registrar and livenessprobe sidecars (the Go module proxy
//! serves neither).
//!
//! Run with `tests/lab/run tests -- claim_chart`.
use k8s_openapi::api::storage::v1::CSINode;
use pillar_csi_lab::{
    agent::ZfsParent,
    apiserver::{install_crypto_provider, ApiServer},
    chart_install::ChartInstall,
    claim_bed::{apply_objects, Layout},
    env::Lab,
    k8s_cluster::{Cluster, DRIVER},
    node_bed::measured,
    pod_life::{event_reasons, pod_life},
    tls::Ca,
    Result,
};
use std::{net::IpAddr, time::Instant};

/// The Node kubelet registers (and the agent's name, the node ID's first part).
const NODE: &str = "chart-node";
/// The agent's gRPC port on the guest's address (the chart's default).
const AGENT_PORT: u16 = 9500;

/// The guest's own address on its user-mode network: what the controller
/// Pod dials the agent at (the agent runs on the host network).
fn guest_address() -> Result<IpAddr> {
    let out = pillar_csi_lab::run("ip", &["-4", "route", "get", "10.0.2.2"])?;
    let mut words = out.split_whitespace();
    words
        .by_ref()
        .find(|w| *w == "src")
        .and_then(|_| words.next())
        .ok_or_else(|| format!("no source address in `ip route get 10.0.2.2`: {out}"))?
        .parse()
        .map_err(Into::into)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_chart_installed_by_helm_serves_a_pod_through_its_own_images() -> Result<()> {
    install_crypto_provider();
    let lab = Lab::get();
    let server = ApiServer::lab()?;
    server.install_chart_crds().await?;
    let parent = ZfsParent::create(&lab, "chart")?;
    let started = Instant::now();
    let cluster = Cluster::start_for_chart(&server, &lab.work, NODE, parent.dataset()).await?;
    let node_ready = started.elapsed().as_secs_f64();
    println!("\n kubelet Ready: {node_ready:.1} s");

    let layout = Layout {
        agent: std::net::SocketAddr::new(guest_address()?, AGENT_PORT),
        pool: parent.pool.clone(),
        parent_dataset: parent.name.clone(),
        vg: lab.vg.clone(),
        thin_pool: lab.thin_pool.clone(),
    };
    let ca = Ca::new(&lab.work.join("chartlab.certs"), "chartlab-ca")?;
    println!("\n [operator] helm install, the agent at {}", layout.agent);
    let chart = ChartInstall::install(&cluster, &server, &lab.work, &layout, &ca).await?;
    let objects = apply_objects(&cluster.admin, "chartlab", &layout).await?;
    let class = &objects.zvol_nvme;
    chart.storage_class(&cluster, class).await?;

    let t = pod_life(&cluster, class, "pods-chart", 64).await?;
    measured(
        &lab,
        &format!(
            "claim_chart {}: kubelet Ready {node_ready:.1} s, images imported {:.1} s, helm \
             install until Ready {:.1} s; Bound {:.1} s, writer Running {:.1} s, grown {:.1} s, \
             detached {:.1} s, reader Succeeded {:.1} s, deleted {:.1} s",
            class.storage_class,
            chart.imported_in,
            chart.ready_in,
            t.bound,
            t.running,
            t.grown,
            t.detached,
            t.read,
            t.deleted
        ),
    )?;
    let reasons = event_reasons(&cluster).await?;
    for reason in [
        "ProvisioningSucceeded",
        "SuccessfulAttachVolume",
        "FileSystemResizeSuccessful",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} event: {reasons:?}"
        );
    }

    let kubelet = cluster.kubelet().ok_or("no kubelet")?;
    let logs = kubelet.pod_logs(2000);
    assert!(
        logs.contains("agent serving") && logs.contains("node plugin serving"),
        "kubelet keeps the release's containers' logs:\n{logs}"
    );
    assert!(
        !logs.contains('\u{1b}'),
        "no terminal escape sequences in the containers' logs:\n{logs}"
    );

    println!("\n [operator] helm uninstall");
    chart.uninstall(&cluster).await?;
    let csinodes = cluster.api::<CSINode>();
    cluster
        .until("kubelet unregistered the node plugin", || {
            let csinodes = csinodes.clone();
            async move {
                let drivers = csinodes
                    .get_opt(NODE)
                    .await?
                    .map(|c| c.spec.drivers)
                    .unwrap_or_default();
                Ok((!drivers.iter().any(|d| d.name == DRIVER)).then_some(()))
            }
        })
        .await?;
    assert_eq!(
        parent.children()?,
        Vec::<String>::new(),
        "no zvol left under {}",
        parent.dataset()
    );
    cluster.stop().await
}
