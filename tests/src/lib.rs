//! Helpers for tests that run in the kernel lab (see `tests/lab/run`).
//!
//! Lab tests are marked `#[ignore = "needs the kernel lab"]`; the lab runner
//! boots a real kernel, prepares a ZFS pool and an LVM volume group, exports
//! their names in `PILLAR_LAB_*` variables and runs the ignored tests. The
//! helpers here are the other side of the wire and the independent witnesses:
//! the kernel NVMe/TCP initiator, the open-iscsi initiator, the storage CLIs (tests only; product code
//! uses the libraries), and data patterns written and read back.
//!
//! [`apiserver`] is the exception that runs on the host: a real
//! kube-apiserver with etcd for the controller's tests (the lab's own runs
//! reach the one the lab runner starts on the host). [`claim_bed`],
//! [`claim_life`], [`claim_cases`] and [`claim_witness`] are the cluster's whole storage path
//! for the `claim_` lab tests and the demo.

pub mod agent;
pub mod apiserver;
pub mod bench;
pub mod block;
pub mod chart_install;
pub mod claim_bed;
pub mod claim_cases;
pub mod claim_life;
pub mod claim_requests;
pub mod claim_witness;
pub mod cmd;
pub mod csi;
pub mod env;
pub mod files_bed;
pub mod guide_world;
pub mod guides;
pub mod host_exec;
pub mod iscsi;
pub mod k8s;
pub mod k8s_cluster;
pub mod kubelet;
pub mod metrics;
pub mod mount;
pub mod nfs;
pub mod node_bed;
pub mod nvme;
pub mod played_kubelet;
pub mod pod_life;
pub mod progress;
pub mod project_fs;
pub mod sanity;
pub mod setup_clock;
pub mod tls;

pub use cmd::{run, CmdError};
pub use env::Lab;

/// The error type of lab helpers: any failure ends the test with its text.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;
