//! `pillar-csi rebind-check INSPECT_JSON PVS_JSON`: the jq checks of the
//! spec's "Rebind a retained volume", step 4, over an InspectVolume answer
//! (grpcurl's JSON) and a PillarVolumeState (`kubectl get pillarvolumestate
//! -o json`). Prints each of the eight lines as jq prints it (with jq's
//! rules: a missing field is null, null equals null, `length` of null is 0,
//! `not` of null is true), each followed by the check it is; exits 1 when
//! any line is not `true`.
use serde_json::Value;

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

/// The eight lines: (what jq prints, the check).
pub fn lines(inspect: &Value, pvs: &Value) -> Vec<(Value, &'static str)> {
    let src = at(pvs, &["spec", "lvmSource"]);
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
    ]
}

/// Reads both files and prints the lines; `Err` when a line is not `true`
/// or a file is unreadable.
pub fn run(inspect: &std::path::Path, pvs: &std::path::Path) -> Result<String, String> {
    let read = |p: &std::path::Path| -> Result<Value, String> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", p.display()))
    };
    let lines = lines(&read(inspect)?, &read(pvs)?);
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
               "spec": {"lvmSource": {"volumeGroup": "data-vg", "logicalVolume": "legacy",
                                      "volumeGroupUUID": "V", "logicalVolumeUUID": "L"}}})
    }

    fn values(i: &Value, p: &Value) -> Vec<Value> {
        lines(i, p).into_iter().map(|(v, _)| v).collect()
    }

    #[test]
    fn every_line_is_true_for_a_matching_idle_volume() {
        assert_eq!(values(&inspect(), &pvs()), vec![Value::Bool(true); 8]);
    }

    /// A change of the inspection or the record.
    type Change = fn(&mut Value, &mut Value);

    #[test]
    fn each_line_turns_false_by_its_own_cause() {
        let cases: [(usize, Change); 8] = [
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
