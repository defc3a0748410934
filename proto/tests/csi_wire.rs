//! The generated `csi.v1` code against bytes written out by hand from the CSI
//! spec's field numbers and the protobuf encoding, and the gRPC service names
//! kubelet and the sidecars dial. The field-by-field comparison with the
//! official descriptor is `csi/conformance` (run by `make test`); these tests
//! check what prost makes of the proto: map, oneof and wrapper encodings.

use pillar_csi_proto::csi::v1::{
    self as csi, plugin_capability, volume_capability, GetCapacityResponse, NodeStageVolumeRequest,
    PluginCapability, ProbeResponse, Snapshot, VolumeCapability,
};
use prost::Message;
use std::collections::HashMap;

fn roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, want: &[u8]) {
    let got = msg.encode_to_vec();
    assert_eq!(got, want, "encoding of {msg:?}");
    let back = M::decode(want).expect("decodes");
    assert_eq!(&back, msg);
}

#[test]
fn node_stage_request_encodes_with_the_spec_field_numbers() {
    let req = NodeStageVolumeRequest {
        volume_id: "v".into(),
        staging_target_path: "/s".into(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: "xfs".into(),
                    mount_flags: vec!["ro".into()],
                    volume_mount_group: String::new(),
                },
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }),
        secrets: HashMap::from([("k".to_string(), "x".to_string())]),
        publish_context: HashMap::new(),
        volume_context: HashMap::new(),
    };
    #[rustfmt::skip]
    let want = [
        0x0a, 0x01, b'v',                    // 1 volume_id
        0x1a, 0x02, b'/', b's',              // 3 staging_target_path
        0x22, 0x0f,                          // 4 volume_capability, 15 bytes
            0x12, 0x09,                      //   2 mount (oneof access_type)
                0x0a, 0x03, b'x', b'f', b's',//     1 fs_type
                0x12, 0x02, b'r', b'o',      //     2 mount_flags
            0x1a, 0x02, 0x08, 0x01,          //   3 access_mode {1 mode: SINGLE_NODE_WRITER}
        0x2a, 0x06,                          // 5 secrets, one map entry
            0x0a, 0x01, b'k', 0x12, 0x01, b'x',
    ];
    roundtrip(&req, &want);
}

#[test]
fn wrapper_fields_tell_unset_from_false_and_zero() {
    // Probe: an unset `ready` is "ready as far as I know"; Some(false) is a
    // present, empty BoolValue.
    roundtrip(&ProbeResponse { ready: None }, &[]);
    roundtrip(&ProbeResponse { ready: Some(false) }, &[0x0a, 0x00]);
    roundtrip(
        &ProbeResponse { ready: Some(true) },
        &[0x0a, 0x02, 0x08, 0x01],
    );
    roundtrip(
        &GetCapacityResponse {
            available_capacity: 5,
            maximum_volume_size: Some(0),
            minimum_volume_size: Some(7),
        },
        &[0x08, 0x05, 0x12, 0x00, 0x1a, 0x02, 0x08, 0x07],
    );
}

#[test]
fn oneofs_timestamps_and_enums_use_the_spec_numbers() {
    roundtrip(
        &PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: plugin_capability::volume_expansion::Type::Online as i32,
                },
            )),
        },
        &[0x12, 0x02, 0x08, 0x01],
    );
    roundtrip(
        &PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: plugin_capability::service::Type::ControllerService as i32,
                },
            )),
        },
        &[0x0a, 0x02, 0x08, 0x01],
    );
    roundtrip(
        &Snapshot {
            size_bytes: 1,
            creation_time: Some(prost_types::Timestamp {
                seconds: 2,
                nanos: 0,
            }),
            ready_to_use: true,
            group_snapshot_id: "g".into(),
            ..Default::default()
        },
        &[
            0x08, 0x01, 0x22, 0x02, 0x08, 0x02, 0x28, 0x01, 0x32, 0x01, b'g',
        ],
    );
    assert_eq!(
        csi::node_service_capability::rpc::Type::VolumeMountGroup as i32,
        6
    );
    assert_eq!(
        csi::controller_service_capability::rpc::Type::GetSnapshot as i32,
        15
    );
    assert_eq!(
        csi::volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        7
    );
}

#[test]
fn services_carry_the_names_kubelet_and_the_sidecars_dial() {
    use tonic::server::NamedService;
    fn name<S: NamedService>() -> &'static str {
        S::NAME
    }
    struct Any;
    assert_eq!(
        name::<csi::identity_server::IdentityServer<Any>>(),
        "csi.v1.Identity"
    );
    assert_eq!(
        name::<csi::controller_server::ControllerServer<Any>>(),
        "csi.v1.Controller"
    );
    assert_eq!(
        name::<csi::group_controller_server::GroupControllerServer<Any>>(),
        "csi.v1.GroupController"
    );
    assert_eq!(
        name::<csi::snapshot_metadata_server::SnapshotMetadataServer<Any>>(),
        "csi.v1.SnapshotMetadata"
    );
    assert_eq!(name::<csi::node_server::NodeServer<Any>>(), "csi.v1.Node");
}
