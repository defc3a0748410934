//! The Controller service against a real kube-apiserver 1.20 and an agent
//! reached over a real mTLS socket: the in-process agent over its simulated
//! backend (`pillar_csi_agent::service::sim`: one zvol pool `tank`, an
//! NVMe/TCP exporter). The kernel adds nothing to the controller's
//! bookkeeping; the kernel path is the agent's lab tests.
use api::crd::*;
use csi::controller::agents::Agents;
use csi::controller::Controller;
use csi::node_id::NodeId;
use csi::publish_context::PublishContext;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, ListParams, PostParams};
use pillar_csi_agent::grpc::AgentGrpc;
use pillar_csi_agent::service::sim;
use pillar_csi_lab::apiserver::ApiServer;
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use pillar_csi_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use std::collections::HashMap;
use tonic::{Code, Request};

mod common;

use common::parts::*;
use common::Result;

const NQN_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21";
const NQN_B: &str = "nqn.2014-08.org.nvmexpress:uuid:1f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a22";
const IQN: &str = "iqn.1993-08.org.debian:01:5e2f9a1b7c3d";

/// An API server with the CRDs, a simulated agent behind mTLS, and the
/// objects of one class `hot` (store tank with parentDataset k8s, NVMe/TCP with ACLs).
struct Bed {
    server: ApiServer,
    client: kube::Client,
    fixture: sim::Fixture,
    controller: Controller,
    _certs: Certs,
    _agent: AgentServer,
}

async fn bed() -> Result<Bed> {
    let server = ApiServer::start()?;
    server.install_chart_crds().await?;
    let client = server.client().await?;
    let certs = Certs::new()?;
    let fixture = sim::fixture();
    let service = AgentGrpc::new(fixture.agent.clone(), "sim");
    let (port, agent) = serve_agent(&certs.agent_server_tls()?, service, 0).await?;
    create_agent(&client, port).await?;
    create_objects(
        &client,
        &[zfs_store()],
        &[class(
            "hot",
            "storage-1-hot",
            "pillar-hot",
            Some(FsType::Xfs),
        )],
    )
    .await?;
    let agents = Agents::new(Some(&certs.controller_tls()))?;
    // The controller runs as its ServiceAccount with the chart's rules only.
    let controller = Controller::new(server.controller_client().await?, agents);
    Ok(Bed {
        server,
        client,
        fixture,
        controller,
        _certs: certs,
        _agent: agent,
    })
}

fn mount_cap(mode: Mode) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "xfs".into(),
            ..Default::default()
        })),
    }
}

fn create_request(name: &str, bytes: i64, params: &[(&str, &str)]) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
        parameters: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
        ..Default::default()
    }
}

fn publish_request(volume: &str, node: &NodeId) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.to_string(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

/// Creates the claim `namespace/name` (64 MiB, ReadWriteOnce) with `annotations`.
async fn claim(
    bed: &Bed,
    namespace: &str,
    name: &str,
    annotations: &[(&str, &str)],
) -> Result<PersistentVolumeClaim> {
    let annotations: HashMap<&str, &str> = annotations.iter().copied().collect();
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }))?;
    Ok(
        Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), namespace)
            .create(&PostParams::default(), &pvc)
            .await?,
    )
}

/// The `(type, reason, message)` of every event about the claim `namespace/name`.
async fn claim_events(
    bed: &Bed,
    namespace: &str,
    name: &str,
) -> Result<Vec<(String, String, String)>> {
    let events = Api::<Event>::namespaced(bed.client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("PersistentVolumeClaim")
                && e.involved_object.name.as_deref() == Some(name)
        })
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect())
}

async fn state(bed: &Bed, name: &str) -> Result<Option<PillarVolumeState>> {
    Ok(Api::<PillarVolumeState>::all(bed.client.clone())
        .get_opt(name)
        .await?)
}

fn exported_initiators(bed: &Bed, volume: &str) -> Vec<String> {
    bed.fixture
        .exporter
        .exports
        .lock()
        .map(|e| {
            e.get(volume)
                .map(|r| r.allowed_initiators.iter().cloned().collect())
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_volume_is_provisioned_published_unpublished_expanded_and_deleted() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let pvc = claim(&bed, "db", "data-postgres-0", &[]).await?;
    let uid = pvc.metadata.uid.clone().ok_or("PVC without UID")?;
    let name = format!("pvc-{uid}");
    let params = [
        ("pillarStorageClass", "hot"),
        ("csi.storage.k8s.io/pvc/name", "data-postgres-0"),
        ("csi.storage.k8s.io/pvc/namespace", "db"),
    ];

    // CreateVolume: the record, then the agent's volume.
    let created = bed
        .controller
        .create_volume(Request::new(create_request(&name, 64 << 20, &params)))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let handle = format!("storage-1/nvmeof-tcp/zfs-zvol/tank/{name}");
    assert_eq!(created.volume_id, handle);
    assert_eq!(created.capacity_bytes, 64 << 20);
    assert_eq!(
        created.volume_context.get("fsType").map(String::as_str),
        Some("xfs")
    );
    assert_eq!(
        created.volume_context.get("existingData"),
        None,
        "a new volume is formatted when blank"
    );
    let record = state(&bed, &name).await?.ok_or("no PillarVolumeState")?;
    assert_eq!(record.spec.agent_volume_id, format!("tank/{name}"));
    assert_eq!(
        record.spec.claim_ref,
        Some(ClaimRef {
            uid: uid.clone(),
            namespace: "db".into(),
            name: "data-postgres-0".into()
        })
    );
    assert_eq!(
        record.status.as_ref().and_then(|s| s.phase),
        Some(VolumePhase::Ready)
    );
    assert_eq!(
        record.spec.resolved.as_ref().map(|r| r.store_ref.as_str()),
        Some("storage-1-hot")
    );
    // Again: the same volume, no second create on the agent.
    let again = bed
        .controller
        .create_volume(Request::new(create_request(&name, 64 << 20, &params)))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    assert_eq!(again.volume_id, handle);
    assert_eq!(
        *bed.fixture.backend.created.lock().map_err(|_| "poison")?,
        1
    );
    // The same name with more bytes than provisioned is another volume.
    let e = bed
        .controller
        .create_volume(Request::new(create_request(&name, 128 << 20, &params)))
        .await
        .expect_err("a larger volume of the same name");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

    // Publish to node A: generation 1, A's NQN admitted, a publish context
    // the node plugin can read.
    let node_a = NodeId::new("worker-a", NQN_A, IQN)?;
    let node_b = NodeId::new("worker-b", NQN_B, IQN)?;
    let context = bed
        .controller
        .controller_publish_volume(Request::new(publish_request(&handle, &node_a)))
        .await?
        .into_inner()
        .publish_context;
    let context = PublishContext::from_map(&context)?;
    assert_eq!(context.protocol, api::tokens::Protocol::NvmeofTcp);
    assert_eq!(context.address.to_string(), "127.0.0.1");
    assert_eq!((context.port, context.lun), (4420, 1));
    // The agent's target name and the identity its export shows reach the
    // node through the publish context.
    assert_eq!(context.target, format!("sim:tank/{name}"));
    assert_eq!(
        context.device_identity,
        Some(format!("identity of tank/{name}"))
    );
    let agent_volume = format!("tank/{name}");
    assert_eq!(exported_initiators(&bed, &agent_volume), [NQN_A]);
    let record = state(&bed, &name).await?.ok_or("no record")?;
    let status = record.status.clone().unwrap_or_default();
    assert_eq!(status.publication_generation, Some(1));
    assert_eq!(status.published_nodes.len(), 1);
    assert_eq!(
        record
            .spec
            .export_spec
            .as_ref()
            .map(|e| e.allowed_initiators.clone()),
        Some(vec![NQN_A.to_owned()])
    );

    // A second node is refused while A holds the single-node volume, and
    // nothing changes.
    let e = bed
        .controller
        .controller_publish_volume(Request::new(publish_request(&handle, &node_b)))
        .await
        .expect_err("a second node");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("published to node worker-a") && e.message().contains("worker-b"),
        "{}",
        e.message()
    );
    assert_eq!(exported_initiators(&bed, &agent_volume), [NQN_A]);
    // Publishing to A again is the same publication.
    bed.controller
        .controller_publish_volume(Request::new(publish_request(&handle, &node_a)))
        .await?;
    let status = state(&bed, &name)
        .await?
        .and_then(|s| s.status)
        .unwrap_or_default();
    assert_eq!(status.publication_generation, Some(1));

    // Unpublish: generation 2, A's NQN gone from the export.
    bed.controller
        .controller_unpublish_volume(Request::new(pb::ControllerUnpublishVolumeRequest {
            volume_id: handle.clone(),
            node_id: node_a.to_string(),
            ..Default::default()
        }))
        .await?;
    let status = state(&bed, &name)
        .await?
        .and_then(|s| s.status)
        .unwrap_or_default();
    assert_eq!(status.publication_generation, Some(2));
    assert!(status.published_nodes.is_empty());
    assert!(exported_initiators(&bed, &agent_volume).is_empty());
    // Now B may have it, under generation 3.
    bed.controller
        .controller_publish_volume(Request::new(publish_request(&handle, &node_b)))
        .await?;
    assert_eq!(exported_initiators(&bed, &agent_volume), [NQN_B]);
    bed.controller
        .controller_unpublish_volume(Request::new(pb::ControllerUnpublishVolumeRequest {
            volume_id: handle.clone(),
            node_id: node_b.to_string(),
            ..Default::default()
        }))
        .await?;

    // Expand, list, capacity.
    let grown = bed
        .controller
        .controller_expand_volume(Request::new(pb::ControllerExpandVolumeRequest {
            volume_id: handle.clone(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 128 << 20,
                limit_bytes: 0,
            }),
            volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert_eq!(grown.capacity_bytes, 128 << 20);
    assert!(grown.node_expansion_required);
    let record = state(&bed, &name).await?.ok_or("no record")?;
    assert_eq!(record.spec.capacity_bytes, 128 << 20);
    let listed = bed
        .controller
        .list_volumes(Request::new(pb::ListVolumesRequest::default()))
        .await?
        .into_inner();
    let ids: Vec<String> = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect();
    assert_eq!(ids, vec![handle.clone()]);
    let capacity = bed
        .controller
        .get_capacity(Request::new(pb::GetCapacityRequest {
            parameters: HashMap::from([("pillarStorageClass".to_owned(), "hot".to_owned())]),
            ..Default::default()
        }))
        .await?
        .into_inner();
    // The simulated pool reports 50 bytes available.
    assert_eq!(capacity.available_capacity, 50);

    // Delete: the agent destroys the zvol, then the record goes; again is fine.
    bed.controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: handle.clone(),
            ..Default::default()
        }))
        .await?;
    assert!(state(&bed, &name).await?.is_none());
    assert_eq!(
        *bed.fixture.backend.destroyed.lock().map_err(|_| "poison")?,
        1
    );
    bed.controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: handle.clone(),
            ..Default::default()
        }))
        .await?;
    let e = bed
        .controller
        .controller_publish_volume(Request::new(publish_request(&handle, &node_a)))
        .await
        .expect_err("publish of a deleted volume");
    assert_eq!(e.code(), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn refusals_name_what_is_wrong_and_the_record_comes_first() -> Result {
    let bed = bed().await?;
    let e = bed
        .controller
        .create_volume(Request::new(create_request("pvc-1", 1 << 20, &[])))
        .await
        .expect_err("no class");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("\"pillarStorageClass\" is missing"),
        "{}",
        e.message()
    );
    let e = bed
        .controller
        .create_volume(Request::new(create_request(
            "pvc-1",
            1 << 20,
            &[("pillarStorageClass", "cold")],
        )))
        .await
        .expect_err("unknown class");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("PillarStorageClass \"cold\"")
            && e.message().contains("does not exist"),
        "{}",
        e.message()
    );
    let mut multi = create_request("pvc-1", 1 << 20, &[("pillarStorageClass", "hot")]);
    multi.volume_capabilities = vec![mount_cap(Mode::MultiNodeMultiWriter)];
    let e = bed
        .controller
        .create_volume(Request::new(multi))
        .await
        .expect_err("multi-node");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("MULTI_NODE_MULTI_WRITER"),
        "{}",
        e.message()
    );
    assert!(
        state(&bed, "pvc-1").await?.is_none(),
        "a refused request wrote a record"
    );

    // An agent that cannot be reached: UNAVAILABLE, and the record (written
    // before the agent call) stays Pending for the retry.
    bed.server.kubectl(&[
        "patch",
        "pillaragent",
        "storage-1",
        "--type=merge",
        "-p",
        "{\"spec\":{\"port\":1}}",
    ])?;
    let e = bed
        .controller
        .create_volume(Request::new(create_request(
            "pvc-2",
            1 << 20,
            &[("pillarStorageClass", "hot")],
        )))
        .await
        .expect_err("agent down");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message().starts_with("agent storage-1:"),
        "{}",
        e.message()
    );
    let record = state(&bed, "pvc-2")
        .await?
        .ok_or("no record before the agent call")?;
    assert_ne!(
        record.status.and_then(|s| s.phase),
        Some(VolumePhase::Ready)
    );
    assert_eq!(
        *bed.fixture.backend.created.lock().map_err(|_| "poison")?,
        0
    );
    // Publishing a volume that never became Ready is refused.
    let node = NodeId::new("worker-a", NQN_A, IQN)?;
    let e = bed
        .controller
        .controller_publish_volume(Request::new(publish_request(&record.spec.volume_id, &node)))
        .await
        .expect_err("not ready");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("not Ready"), "{}", e.message());

    let v = bed
        .controller
        .validate_volume_capabilities(Request::new(pb::ValidateVolumeCapabilitiesRequest {
            volume_id: record.spec.volume_id.clone(),
            volume_capabilities: vec![mount_cap(Mode::MultiNodeReaderOnly)],
            ..Default::default()
        }))
        .await?
        .into_inner();
    assert!(v.confirmed.is_none());
    assert!(
        v.message.contains("MULTI_NODE_READER_ONLY"),
        "{}",
        v.message
    );
    let e = bed
        .controller
        .validate_volume_capabilities(Request::new(pb::ValidateVolumeCapabilitiesRequest {
            volume_id: "storage-1/iscsi/lvm-lv/vg/none".into(),
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
            ..Default::default()
        }))
        .await
        .expect_err("unknown volume");
    assert_eq!(e.code(), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn a_refusal_is_an_event_on_the_claim_text_for_text() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let pvc = claim(&bed, "db", "data-0", &[]).await?;
    let name = format!("pvc-{}", pvc.metadata.uid.ok_or("PVC without UID")?);
    let e = bed
        .controller
        .create_volume(Request::new(create_request(
            &name,
            1 << 20,
            &[
                ("pillarStorageClass", "cold"),
                ("csi.storage.k8s.io/pvc/name", "data-0"),
                ("csi.storage.k8s.io/pvc/namespace", "db"),
            ],
        )))
        .await
        .expect_err("unknown class");
    let events = claim_events(&bed, "db", "data-0").await?;
    assert_eq!(
        events,
        vec![(
            "Warning".to_owned(),
            "ProvisioningFailed".to_owned(),
            e.message().to_owned()
        )]
    );
    Ok(())
}

/// CSI requires `capacity_range` of ControllerExpandVolume: without one
/// the request is refused naming the field, and the agent is not asked to
/// grow the volume to a size nobody requested.
#[tokio::test]
async fn expand_without_a_capacity_range_is_refused_and_grows_nothing() -> Result {
    let bed = bed().await?;
    let created = bed
        .controller
        .create_volume(Request::new(create_request(
            "pvc-e",
            1 << 20,
            &[("pillarStorageClass", "hot")],
        )))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let sizes = || -> Result<Vec<u64>> {
        Ok(bed
            .fixture
            .backend
            .volumes
            .lock()
            .map_err(|_| "poison")?
            .values()
            .copied()
            .collect())
    };
    assert_eq!(sizes()?, [1 << 20]);
    for range in [
        None,
        Some(pb::CapacityRange {
            required_bytes: 0,
            limit_bytes: 0,
        }),
    ] {
        let e = bed
            .controller
            .controller_expand_volume(Request::new(pb::ControllerExpandVolumeRequest {
                volume_id: created.volume_id.clone(),
                capacity_range: range,
                volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
                ..Default::default()
            }))
            .await
            .expect_err("expand without a size");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("capacity_range"), "{}", e.message());
    }
    assert_eq!(sizes()?, [1 << 20]);
    let record = state(&bed, "pvc-e").await?.ok_or("no record")?;
    assert_eq!(record.spec.capacity_bytes, 1 << 20);
    Ok(())
}

/// The controller does not offer PUBLISH_READONLY (the target cannot
/// serve a volume read-only to one initiator): a readonly
/// ControllerPublishVolume is refused before anything is recorded or
/// exported, instead of publishing the volume writable.
#[tokio::test]
async fn a_readonly_publish_is_refused_and_publishes_nothing() -> Result {
    let bed = bed().await?;
    let created = bed
        .controller
        .create_volume(Request::new(create_request(
            "pvc-ro",
            1 << 20,
            &[("pillarStorageClass", "hot")],
        )))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let node = NodeId::new("worker-a", NQN_A, IQN)?;
    let mut request = publish_request(&created.volume_id, &node);
    request.readonly = true;
    let e = bed
        .controller
        .controller_publish_volume(Request::new(request))
        .await
        .expect_err("a readonly publish");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("readonly") && e.message().contains("PUBLISH_READONLY"),
        "{}",
        e.message()
    );
    let record = state(&bed, "pvc-ro").await?.ok_or("no record")?;
    assert!(record
        .status
        .map(|s| s.published_nodes.is_empty())
        .unwrap_or(true));
    assert!(bed
        .fixture
        .exporter
        .exports
        .lock()
        .map_err(|_| "poison")?
        .is_empty());
    // The capability is not advertised, so a CO sends readonly false.
    assert!(!csi::controller::capabilities::RPCS
        .contains(&pb::controller_service_capability::rpc::Type::PublishReadonly));
    Ok(())
}

/// ListVolumes pages continue after the last volume seen: a volume deleted
/// or added between two pages makes the next page neither skip nor repeat
/// one, and a token this controller cannot have issued is ABORTED.
#[tokio::test]
async fn list_pages_neither_skip_nor_repeat_when_volumes_come_and_go() -> Result {
    let bed = bed().await?;
    let mut handles = HashMap::new();
    for name in ["pvc-a", "pvc-b", "pvc-c", "pvc-d"] {
        let volume = bed
            .controller
            .create_volume(Request::new(create_request(
                name,
                1 << 20,
                &[("pillarStorageClass", "hot")],
            )))
            .await?
            .into_inner()
            .volume
            .ok_or("no volume")?;
        handles.insert(volume.volume_id, name);
    }
    let page = |token: &str, max: i32| {
        let request = pb::ListVolumesRequest {
            max_entries: max,
            starting_token: token.to_owned(),
        };
        let (controller, handles) = (&bed.controller, &handles);
        async move {
            let listed = controller
                .list_volumes(Request::new(request))
                .await?
                .into_inner();
            let names: Vec<&str> = listed
                .entries
                .iter()
                .filter_map(|e| e.volume.as_ref())
                .map(|v| handles.get(&v.volume_id).copied().unwrap_or("?"))
                .collect();
            Ok::<_, tonic::Status>((names, listed.next_token))
        }
    };
    let delete = |name: &str| {
        let handle = handles
            .iter()
            .find(|(_, n)| **n == name)
            .map(|(h, _)| h.clone())
            .unwrap_or_default();
        bed.controller
            .delete_volume(Request::new(pb::DeleteVolumeRequest {
                volume_id: handle,
                ..Default::default()
            }))
    };

    // A volume of the first page goes before the second is asked for.
    let (first, token) = page("", 2).await?;
    assert_eq!(first, ["pvc-a", "pvc-b"]);
    delete("pvc-a").await?;
    let (second, token) = page(&token, 2).await?;
    assert_eq!(second, ["pvc-c", "pvc-d"], "after deleting pvc-a");
    assert_eq!(token, "");

    // A volume that sorts before the page comes before the next is asked for.
    let (first, token) = page("", 1).await?;
    assert_eq!(first, ["pvc-b"]);
    let added = bed
        .controller
        .create_volume(Request::new(create_request(
            "pvc-0",
            1 << 20,
            &[("pillarStorageClass", "hot")],
        )))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let (second, _) = page(&token, 1).await?;
    assert!(added.volume_id.ends_with("/pvc-0"));
    assert_eq!(second, ["pvc-c"], "after adding pvc-0");

    // csi-sanity's invalid token is a valid object name.
    for garbage in ["invalid-token", "pvc-b", "after:", "after:UPPER", "2", "-1"] {
        let e = page(garbage, 1).await.expect_err(garbage);
        assert_eq!(e.code(), Code::Aborted, "{garbage:?}: {e:?}");
    }
    Ok(())
}
