//! The CSI Identity service: the driver's name and version, what it offers,
//! and whether it is ready.
use pillar_csi_proto::csi::v1::{self as pb, identity_server, plugin_capability};
use std::sync::Arc;
use tonic::{Request, Response, Status};

use crate::driver::Driver;

/// The block identity's name (its CSIDriver object's name).
pub const DRIVER_NAME: &str = api::DRIVER_NAME;

/// Whether the plugin is ready: `Err` says what is missing.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The Identity service.
#[derive(Clone)]
pub struct IdentityService {
    driver: Driver,
    version: String,
    ready: Readiness,
}

impl std::fmt::Debug for IdentityService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityService")
            .field("driver", &self.driver)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl IdentityService {
    /// Reports `driver`'s name and `version`, and asks `ready` on every
    /// Probe.
    pub fn new(driver: Driver, version: &str, ready: Readiness) -> Self {
        Self {
            driver,
            version: version.to_owned(),
            ready,
        }
    }
}

/// The plugin capabilities of `driver`: the controller service (the same
/// driver runs one), online volume expansion (the node grows mounted ext4
/// and XFS), and, for the files identity, volume accessibility
/// constraints (its node-local volumes are reachable from one node).
pub fn plugin_capabilities(driver: Driver) -> Vec<pb::PluginCapability> {
    let mut capabilities = vec![
        pb::PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: plugin_capability::service::Type::ControllerService as i32,
                },
            )),
        },
        pb::PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: plugin_capability::volume_expansion::Type::Online as i32,
                },
            )),
        },
    ];
    if driver == Driver::Files {
        capabilities.push(pb::PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: plugin_capability::service::Type::VolumeAccessibilityConstraints as i32,
                },
            )),
        });
    }
    capabilities
}

#[tonic::async_trait]
impl identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: self.driver.name().to_owned(),
            vendor_version: self.version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: plugin_capabilities(self.driver),
        }))
    }

    async fn probe(
        &self,
        _request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        let ready = (self.ready)();
        if let Err(why) = &ready {
            tracing::warn!("not ready: {why}");
        }
        Ok(Response::new(pb::ProbeResponse {
            ready: Some(ready.is_ok()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use identity_server::Identity;

    #[tokio::test]
    async fn identity_names_the_driver_and_probes_readiness() {
        let service =
            IdentityService::new(Driver::Block, "0.1.0 (abc)", Arc::new(|| Err("no".into())));
        let info = service
            .get_plugin_info(Request::new(pb::GetPluginInfoRequest {}))
            .await
            .expect("info")
            .into_inner();
        assert_eq!(
            (info.name.as_str(), info.vendor_version.as_str()),
            (DRIVER_NAME, "0.1.0 (abc)")
        );
        let probe = service
            .probe(Request::new(pb::ProbeRequest {}))
            .await
            .expect("probe")
            .into_inner();
        assert_eq!(probe.ready, Some(false));
        let ready = IdentityService::new(Driver::Files, "v", Arc::new(|| Ok(())));
        let info = ready
            .get_plugin_info(Request::new(pb::GetPluginInfoRequest {}))
            .await
            .expect("info");
        assert_eq!(info.into_inner().name, "files.pillar-csi.bhyoo.com");
        let probe = ready
            .probe(Request::new(pb::ProbeRequest {}))
            .await
            .expect("probe");
        assert_eq!(probe.into_inner().ready, Some(true));
        assert_eq!(plugin_capabilities(Driver::Block).len(), 2);
        assert_eq!(plugin_capabilities(Driver::Files).len(), 3);
    }
}
