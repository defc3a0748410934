//! GetCapacity without a class (the sum over every PillarStore) against a
//! real kube-apiserver 1.20 and the simulated agent behind mTLS (see
//! `common`): a store whose agent is unreachable is left out of the sum
//! rather than failing it, and only when no store answers is the call
//! refused, with the agent named.
mod common;

use api::crd::{PillarAgent, PillarAgentSpec, PillarStore};
use common::*;
use kube::api::{Api, PostParams};
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::{Code, Request};

async fn classless(bed: &Bed) -> std::result::Result<i64, tonic::Status> {
    Ok(bed
        .controller
        .get_capacity(Request::new(pb::GetCapacityRequest::default()))
        .await?
        .into_inner()
        .available_capacity)
}

#[tokio::test]
async fn a_classless_capacity_leaves_out_a_store_whose_agent_is_unreachable() -> Result {
    let bed = bed().await?;
    let both = classless(&bed).await?;
    assert!(both > 0, "{both}");

    // A second agent nothing listens for, with a store of its own.
    let gone = PillarAgent::new(
        "storage-2",
        PillarAgentSpec {
            address: "127.0.0.1".into(),
            port: 1,
            tls_server_name: None,
            node_name: None,
        },
    );
    Api::<PillarAgent>::all(bed.client.clone())
        .create(&PostParams::default(), &gone)
        .await?;
    let mut store = parts::zfs_store();
    store.metadata.name = Some("storage-2-hot".into());
    store.spec.agent_ref = "storage-2".into();
    Api::<PillarStore>::all(bed.client.clone())
        .create(&PostParams::default(), &store)
        .await?;
    assert_eq!(
        classless(&bed).await?,
        both,
        "the unreachable store changed the sum"
    );

    // No agent answers: refused, naming one.
    bed.agent_at(1)?;
    let e = classless(&bed).await.expect_err("a sum of no store");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().starts_with("agent storage-"), "{e:?}");
    Ok(())
}
