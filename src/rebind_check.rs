//! `pillar-csi rebind-check INSPECT_JSON PVS_JSON` (or, live, `--agent
//! ... [--volume-id ...]` with `--pvs-json FILE` or `--pvs-name NAME`): the jq
//! checks of the spec's "Rebind a retained volume", step 4, over an
//! InspectVolume answer (grpcurl's JSON) and a PillarVolumeState (`kubectl
//! get pillarvolumestate -o json`). Prints each line as jq prints it (with
//! jq's rules: a missing field is null, null equals null, `length` of null
//! is 0, `not` of null is true), each followed by the check it is; exits 1
//! when any line is not `true`.
//!
//! Two things go beyond the spec's jq. `$src` is `$pvs.spec.lvmSource //
//! $pvs.spec.recovery.source`: a record born for a metadata-loss recovery
//! carries its LV there (it cannot have `lvmSource`), and the spec's
//! literal `$pvs.spec.lvmSource` would fail such a volume forever. And a
//! ninth line, `$in.volumeId == $pvs.spec.agentVolumeID`: the spec inspects
//! the record's own agentVolumeID, so it holds there by construction, but
//! here the inspection and the record come from two places (two files, or
//! `--volume-id` and the record).
use crate::agent_call::{inspect as inspect_live, AgentFlags, VolumeFlags};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// `a.b.c` of `v`, null when missing (jq's `.a.b.c`).
fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter()
        .try_fold(v, |v, key| v.get(key))
        .unwrap_or(&Value::Null)
}

/// jq's `length` of an array, object, string or null.
fn length(v: &Value) -> usize {
    match v {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        Value::String(s) => s.chars().count(),
        _ => 0,
    }
}

/// jq's truthiness: everything but false and null.
fn truthy(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false))
}

/// The spec's `same(x; s)`: an inspected identity against the record's source.
fn same(x: &Value, s: &Value) -> bool {
    at(x, &["volumeGroup"]) == at(s, &["volumeGroup"])
        && at(x, &["logicalVolume"]) == at(s, &["logicalVolume"])
        && at(x, &["volumeGroupUuid"]) == at(s, &["volumeGroupUUID"])
        && at(x, &["logicalVolumeUuid"]) == at(s, &["logicalVolumeUUID"])
}

/// The record's LV: `$pvs.spec.lvmSource // $pvs.spec.recovery.source`.
fn source(pvs: &Value) -> &Value {
    let src = at(pvs, &["spec", "lvmSource"]);
    if truthy(src) {
        src
    } else {
        at(pvs, &["spec", "recovery", "source"])
    }
}

/// The nine lines: (what jq prints, the check).
pub fn lines(inspect: &Value, pvs: &Value) -> Vec<(Value, &'static str)> {
    let src = source(pvs);
    vec![
        (
            at(inspect, &["fence", "exists"]).clone(),
            "$in.fence.exists",
        ),
        (
            Value::from(at(inspect, &["fence", "volumeUid"]) == at(pvs, &["metadata", "uid"])),
            "$in.fence.volumeUid == $pvs.metadata.uid",
        ),
        (
            Value::from(!truthy(at(inspect, &["fence", "ended"]))),
            "($in.fence.ended | not)",
        ),
        (
            Value::from(same(at(inspect, &["fence", "lvmSource"]), src)),
            "same($in.fence.lvmSource; $src)",
        ),
        (
            Value::from(same(at(inspect, &["lvm", "identity"]), src)),
            "same($in.lvm.identity; $src)",
        ),
        (
            Value::from(length(at(inspect, &["exports"])) == 0),
            "($in.exports | length) == 0",
        ),
        (
            Value::from(length(at(inspect, &["consumers"])) == 0),
            "($in.consumers | length) == 0",
        ),
        (
            Value::from(at(inspect, &["lvm", "exclusiveClaim"]) == "free"),
            "$in.lvm.exclusiveClaim == \"free\"",
        ),
        (
            Value::from(at(inspect, &["volumeId"]) == at(pvs, &["spec", "agentVolumeID"])),
            "$in.volumeId == $pvs.spec.agentVolumeID",
        ),
    ]
}

/// `rebind-check`: the inspection from a file or from the agent (live),
/// the PillarVolumeState from a file or from the API server.
#[derive(clap::Args)]
pub struct RebindArgs {
    /// The InspectVolume answer (grpcurl's JSON); or `--agent` to call it.
    inspect_json: Option<PathBuf>,
    /// The PillarVolumeState (`kubectl get pillarvolumestate -o json`); or
    /// `--pvs-json` / `--pvs-name`.
    pvs_json: Option<PathBuf>,
    #[command(flatten)]
    agent: AgentFlags,
    #[command(flatten)]
    volume: VolumeFlags,
    /// The PillarVolumeState file (with `--agent`; `--volume-id` defaults
    /// to its `spec.agentVolumeID`).
    #[arg(long = "pvs-json", value_name = "FILE")]
    pvs_file: Option<PathBuf>,
    /// The PillarVolumeState's name, read from the API server.
    #[arg(long, value_name = "NAME")]
    pvs_name: Option<String>,
    /// The kubeconfig for `--pvs-name` (default: $KUBECONFIG, ~/.kube/config
    /// or the in-cluster account).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
}

fn read(p: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", p.display()))
}

/// The PillarVolumeState `name` as the API server stores it (raw JSON).
fn pvs_from_api(name: &str, kubeconfig: Option<&Path>) -> Result<Value, String> {
    use kube::api::{Api, ApiResource, DynamicObject};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let config = match kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &Default::default())
                    .await
                    .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
            }
            None => kube::Config::infer()
                .await
                .map_err(|e| format!("no kubeconfig and not in a cluster: {e}"))?,
        };
        let client =
            kube::Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))?;
        let resource = ApiResource::erase::<api::crd::PillarVolumeState>(&());
        let object = Api::<DynamicObject>::all_with(client, &resource)
            .get(name)
            .await
            .map_err(|e| format!("PillarVolumeState {name:?}: {e}"))?;
        serde_json::to_value(object).map_err(|e| e.to_string())
    })
}

/// Reads (or fetches) both sides and prints the lines; `Err` when a line
/// is not `true` or a side cannot be read.
pub fn run(a: RebindArgs) -> Result<String, String> {
    let usage = "give INSPECT_JSON PVS_JSON, or --agent HOST:PORT --cert --key --cacert [--volume-id VG/LV] with --pvs-json FILE or --pvs-name NAME";
    let (inspect, pvs) = match (&a.inspect_json, &a.pvs_json, &a.agent.agent) {
        (Some(i), Some(p), None) if a.pvs_file.is_none() && a.pvs_name.is_none() => {
            (read(i)?, read(p)?)
        }
        (None, None, Some(_)) => {
            let pvs = match (&a.pvs_file, &a.pvs_name) {
                (Some(file), None) => read(file)?,
                (None, Some(name)) => pvs_from_api(name, a.kubeconfig.as_deref())?,
                _ => {
                    return Err(format!(
                        "one of --pvs-json and --pvs-name is needed: {usage}"
                    ))
                }
            };
            // The volume the record names, unless --volume-id says otherwise
            // (then the last line compares the two).
            let mut volume = a.volume.clone();
            if volume.volume_id.is_none() {
                volume.volume_id = Some(
                    at(&pvs, &["spec", "agentVolumeID"])
                        .as_str()
                        .ok_or("the PillarVolumeState has no spec.agentVolumeID; give --volume-id")?
                        .to_owned(),
                );
            }
            (inspect_live(&a.agent, &volume)?, pvs)
        }
        _ => return Err(usage.into()),
    };
    let lines = lines(&inspect, &pvs);
    let text: Vec<String> = lines
        .iter()
        .map(|(value, check)| format!("{value}\t# {check}"))
        .collect();
    let text = text.join("\n");
    if lines.iter().all(|(v, _)| v == &Value::Bool(true)) {
        Ok(text)
    } else {
        Err(format!("{text}\na line is not true: do not bind"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn inspect() -> Value {
        json!({
            "volumeId": "data-vg/legacy",
            "fence": {"exists": true, "ended": false, "volumeUid": "u1",
                      "lvmSource": {"volumeGroup": "data-vg", "logicalVolume": "legacy",
                                    "volumeGroupUuid": "V", "logicalVolumeUuid": "L"}},
            "lvm": {"identity": {"volumeGroup": "data-vg", "logicalVolume": "legacy",
                                 "volumeGroupUuid": "V", "logicalVolumeUuid": "L"},
                    "exclusiveClaim": "free"},
            "exports": [], "consumers": []
        })
    }

    fn pvs() -> Value {
        json!({"metadata": {"uid": "u1"},
               "spec": {"agentVolumeID": "data-vg/legacy", "lvmSource": {"volumeGroup": "data-vg", "logicalVolume": "legacy",
                                      "volumeGroupUUID": "V", "logicalVolumeUUID": "L"}}})
    }

    fn values(i: &Value, p: &Value) -> Vec<Value> {
        lines(i, p).into_iter().map(|(v, _)| v).collect()
    }

    #[test]
    fn every_line_is_true_for_a_matching_idle_volume() {
        assert_eq!(values(&inspect(), &pvs()), vec![Value::Bool(true); 9]);
    }

    #[test]
    fn a_recovered_record_is_checked_against_its_recovery_source() {
        // As the controller keeps it: spec.recovery.source, no lvmSource.
        let mut p = pvs();
        let source = p["spec"]
            .as_object_mut()
            .unwrap()
            .remove("lvmSource")
            .unwrap();
        p["spec"]["recovery"] = json!({"oldVolumeUID": "u0", "source": source});
        assert_eq!(values(&inspect(), &p), vec![Value::Bool(true); 9]);
        p["spec"]["recovery"]["source"]["logicalVolumeUUID"] = json!("X");
        let got = values(&inspect(), &p);
        assert_eq!(
            (got[3].clone(), got[4].clone()),
            (Value::Bool(false), Value::Bool(false))
        );
        // A record with neither: lines 4 and 5 are false, as in jq.
        p["spec"].as_object_mut().unwrap().remove("recovery");
        let got = values(&inspect(), &p);
        assert_eq!(
            (got[3].clone(), got[4].clone()),
            (Value::Bool(false), Value::Bool(false))
        );
    }

    /// A change of the inspection or the record.
    type Change = fn(&mut Value, &mut Value);

    #[test]
    fn each_line_turns_false_by_its_own_cause() {
        let cases: [(usize, Change); 9] = [
            (0, |i, _| i["fence"]["exists"] = json!(false)),
            (1, |_, p| p["metadata"]["uid"] = json!("u2")),
            (2, |i, _| i["fence"]["ended"] = json!(true)),
            (3, |i, _| {
                i["fence"]["lvmSource"]["logicalVolumeUuid"] = json!("X")
            }),
            (4, |_, p| {
                p["spec"]["lvmSource"]["volumeGroupUUID"] = json!("X")
            }),
            (5, |i, _| i["exports"] = json!([{"targetId": "nqn.x"}])),
            (6, |i, _| i["consumers"] = json!([{"kind": "mount"}])),
            (7, |i, _| i["lvm"]["exclusiveClaim"] = json!("busy")),
            (8, |_, p| {
                p["spec"]["agentVolumeID"] = json!("data-vg/other")
            }),
        ];
        for (line, change) in cases {
            let (mut i, mut p) = (inspect(), pvs());
            change(&mut i, &mut p);
            let got = values(&i, &p);
            for (n, v) in got.iter().enumerate() {
                let want = if n == line || (line == 4 && n == 3) {
                    // The record's source feeds lines 4 and 5.
                    Value::Bool(false)
                } else {
                    Value::Bool(true)
                };
                assert_eq!(
                    v,
                    &want,
                    "change of line {} shows in line {}",
                    line + 1,
                    n + 1
                );
            }
        }
    }

    #[test]
    fn missing_fields_follow_jq() {
        // jq: a missing `exists` prints null; a missing `ended` is not ended.
        let mut i = inspect();
        i["fence"].as_object_mut().map(|f| f.remove("exists"));
        i["fence"].as_object_mut().map(|f| f.remove("ended"));
        let got = values(&i, &pvs());
        assert_eq!(got[0], Value::Null);
        assert_eq!(got[2], Value::Bool(true));
    }
}
