//! The agent's request checks: any bytes, decoded as each agent request
//! message, go through the agent's own gRPC service (`grpc::AgentGrpc`, the
//! one the server runs) without a panic, and a request it refuses before it
//! touches a volume's record is refused with INVALID_ARGUMENT.
//!
//! The checks are not one function: each RPC converts its wire values
//! (`grpc::convert`) and the agent checks the volume ID, size, backend,
//! protocol, initiators and CHAP before it takes the volume's lock and loads
//! its mark. So the target runs the whole service over the simulated
//! backends (feature `sim`: zvol pool `tank`, volume group `data-vg`) and the
//! real NVMe/TCP, iSCSI, NFS and node-local exporters (their configfs roots and exports
//! folder do not exist; their initiator checks touch nothing), with a mark store whose folder has
//! been replaced by a file. A request that passes every check then fails
//! loading its mark with INTERNAL naming that folder: that is the end of
//! validation, and nothing is created anywhere.
//!
//! Input: one byte choosing the RPC, then the encoded request.
//!
//! Refusals other than INVALID_ARGUMENT the property allows, each a fact of
//! the agent's configuration rather than of the request: GetCapacity's
//! NOT_FOUND (no backend of that type and pool), InspectVolume's
//! UNIMPLEMENTED (zvols are not inspected), TransferVolumeOwnership's
//! UNAVAILABLE (recovery is not configured here, so its checks are not
//! reached), and the UNIMPLEMENTED of CreateVolume with a content source
//! and of the snapshot RPCs (the simulated backends take no snapshots,
//! which the agent checks once the request's own fields passed).
//!
//! The fuzz crate links the agent itself (and so its ZFS and LVM C
//! libraries, dynamic libraries the build host has anyway): no copy of
//! any check is fuzzed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pillar_csi_agent::{
    config::Listener,
    export::{Exporter, LioExporter, LocalExporter, NfsExporter, NvmetExporter, TargetNames},
    grpc::AgentGrpc,
    marks::MarkStore,
    service::{sim::SimBackend, sim_lvm::SimLvm, Agent},
};
use pillar_csi_proto::agent::v1::{self as pb, agent_service_server::AgentService};
use prost::Message;
use std::sync::{Arc, OnceLock};
use tonic::{Code, Request, Status};

/// Made once per process. Its temporary folder (holding only the file that
/// replaced the mark folder) outlives the process: libFuzzer ends with
/// `exit`, and statics are never dropped.
struct Harness {
    runtime: tokio::runtime::Runtime,
    grpc: AgentGrpc,
    /// The mark folder, now a file: an error naming it is the sentinel.
    marks: String,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let marks_dir = dir.path().join("marks");
        let marks = MarkStore::open(&marks_dir).expect("mark store");
        std::fs::remove_dir(&marks_dir).expect("remove the mark folder");
        std::fs::write(&marks_dir, "").expect("a file in its place");
        let listener = Listener {
            address: [127, 0, 0, 1].into(),
            port: 4420,
        };
        let nowhere = dir.path().join("no-configfs");
        let exporters: Vec<Arc<dyn Exporter>> = vec![
            Arc::new(NvmetExporter::new(
                nvmet::Nvmet::with_tree(configfs::Tree::at(nowhere.join("nvmet"))),
                listener,
                nvmet::PortId(1),
                TargetNames::new("fuzz").expect("agent name"),
            )),
            Arc::new(LioExporter::new(
                lio::Lio::with_tree(configfs::Tree::at(nowhere.join("target")))
                    .with_lock_file(dir.path().join("lio.lock")),
                listener,
                TargetNames::new("fuzz").expect("agent name"),
            )),
            // Its exports folder is never written: every request stops at
            // the mark store first; `false` stands in for exportfs.
            Arc::new(NfsExporter::with_dir(
                listener,
                nowhere.join("exports.d"),
                vec!["false".into()],
            )),
            // Node-local volumes (no kernel target): its node-name checks
            // are fuzzed too, and a `local` request is no longer refused
            // as a protocol this agent lacks.
            Arc::new(LocalExporter),
        ];
        let agent = Agent::new(
            vec![Arc::new(SimBackend::default()), Arc::new(SimLvm::default())],
            exporters,
            marks,
        );
        Harness {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
            grpc: AgentGrpc::new(Arc::new(agent), "fuzz"),
            marks: marks_dir.display().to_string(),
            _dir: dir,
        }
    })
}

/// Decodes `bytes` as `$msg`, calls `$method` and returns the refusal, if
/// any (a message that does not decode is no request).
macro_rules! call {
    ($h:expr, $bytes:expr, $msg:ty, $method:ident) => {{
        let Ok(request) = <$msg>::decode($bytes) else {
            return;
        };
        $h.runtime
            .block_on($h.grpc.$method(Request::new(request)))
            .err()
    }};
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let h = harness();
    let (rpc, refusal, allowed): (&str, Option<Status>, Option<Code>) = match which % 18 {
        0 => (
            "GetCapabilities",
            call!(h, bytes, pb::GetCapabilitiesRequest, get_capabilities),
            None,
        ),
        1 => (
            "GetCapacity",
            call!(h, bytes, pb::GetCapacityRequest, get_capacity),
            Some(Code::NotFound),
        ),
        2 => (
            "ListVolumes",
            call!(h, bytes, pb::ListVolumesRequest, list_volumes),
            None,
        ),
        3 => (
            "HealthCheck",
            call!(h, bytes, pb::HealthCheckRequest, health_check),
            None,
        ),
        4 => (
            "CreateVolume",
            call!(h, bytes, pb::CreateVolumeRequest, create_volume),
            Some(Code::Unimplemented),
        ),
        5 => (
            "DeleteVolume",
            call!(h, bytes, pb::DeleteVolumeRequest, delete_volume),
            None,
        ),
        6 => (
            "ExpandVolume",
            call!(h, bytes, pb::ExpandVolumeRequest, expand_volume),
            None,
        ),
        7 => (
            "ExportVolume",
            call!(h, bytes, pb::ExportVolumeRequest, export_volume),
            None,
        ),
        8 => (
            "UnexportVolume",
            call!(h, bytes, pb::UnexportVolumeRequest, unexport_volume),
            None,
        ),
        9 => (
            "AllowInitiator",
            call!(h, bytes, pb::AllowInitiatorRequest, allow_initiator),
            None,
        ),
        10 => (
            "DenyInitiator",
            call!(h, bytes, pb::DenyInitiatorRequest, deny_initiator),
            None,
        ),
        11 => (
            "ReleaseVolume",
            call!(h, bytes, pb::ReleaseVolumeRequest, release_volume),
            None,
        ),
        12 => (
            "InspectVolume",
            call!(h, bytes, pb::InspectVolumeRequest, inspect_volume),
            Some(Code::Unimplemented),
        ),
        13 => (
            "TransferVolumeOwnership",
            call!(
                h,
                bytes,
                pb::TransferVolumeOwnershipRequest,
                transfer_volume_ownership
            ),
            Some(Code::Unavailable),
        ),
        14 => (
            "CreateSnapshot",
            call!(h, bytes, pb::CreateSnapshotRequest, create_snapshot),
            Some(Code::Unimplemented),
        ),
        15 => (
            "DeleteSnapshot",
            call!(h, bytes, pb::DeleteSnapshotRequest, delete_snapshot),
            Some(Code::Unimplemented),
        ),
        16 => (
            "ListSnapshots",
            call!(h, bytes, pb::ListSnapshotsRequest, list_snapshots),
            None,
        ),
        _ => (
            "ReconcileState",
            call!(h, bytes, pb::ReconcileStateRequest, reconcile_state),
            None,
        ),
    };
    let Some(status) = refusal else {
        return;
    };
    let reached_the_mark =
        status.code() == Code::Internal && status.message().contains(h.marks.as_str());
    assert!(
        status.code() == Code::InvalidArgument
            || reached_the_mark
            || Some(status.code()) == allowed,
        "{rpc} refused with {:?}: {}",
        status.code(),
        status.message()
    );
});
