//! Events the controller posts on the objects users look at: a refusal on
//! the PersistentVolumeClaim (`kubectl describe pvc` shows it) and on the
//! PillarVolumeState.
//!
//! Posting is best effort: an event that cannot be written is logged and
//! never turns a CSI answer into another one.
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};

/// The `source.component` and `reportingComponent` of every event.
pub const COMPONENT: &str = "pillar-csi-controller";

/// Cluster-scoped objects have their events in this namespace, where
/// `kubectl describe` looks for them.
const CLUSTER_EVENTS_NAMESPACE: &str = "default";

/// Whether an event reports something normal or a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Progress a user may want to see.
    Normal,
    /// A refusal or failure.
    Warning,
}

/// Writes events through one Kubernetes client.
#[derive(Clone)]
pub struct Events {
    client: kube::Client,
}

/// The reference an event carries for `object`.
pub fn reference_of<K>(object: &K) -> ObjectReference
where
    K: Resource<DynamicType = ()>,
{
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: object.meta().name.clone(),
        namespace: object.meta().namespace.clone(),
        uid: object.meta().uid.clone(),
        resource_version: object.meta().resource_version.clone(),
        field_path: None,
    }
}

impl Events {
    /// Events written through `client`.
    pub fn new(client: kube::Client) -> Self {
        Events { client }
    }

    /// Posts an event about `object` with a `reason` (CamelCase, e.g.
    /// `ImportRefused`) and the `message` users read.
    pub async fn post<K>(&self, object: &K, kind: Kind, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let involved = reference_of(object);
        let namespace = object
            .namespace()
            .unwrap_or_else(|| CLUSTER_EVENTS_NAMESPACE.to_owned());
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", object.name_any())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some(
                match kind {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .to_owned(),
            ),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            // The API server (1.20) accepts an event with eventTime about a
            // cluster-scoped object only in kube-system; like client-go's
            // recorder, such events go to "default" without eventTime.
            event_time: object.namespace().map(|_| MicroTime(now)),
            count: Some(1),
            reporting_component: Some(COMPONENT.to_owned()),
            reporting_instance: Some(
                std::env::var("HOSTNAME").unwrap_or_else(|_| COMPONENT.to_owned()),
            ),
            action: Some(reason.to_owned()),
            source: Some(EventSource {
                component: Some(COMPONENT.to_owned()),
                host: None,
            }),
            ..Default::default()
        };
        let api = Api::<Event>::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(reason, message, error = %e, "could not post an event");
        }
    }
}
