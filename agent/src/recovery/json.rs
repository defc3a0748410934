//! The RecoverySnapshot of an InspectVolume answer printed as proto3 JSON
//! (grpcurl's form, which the spec's Go program reads with
//! `protojson.Unmarshal`): camelCase names (the .proto names are accepted
//! too), enums by name or number, 64-bit integers as strings or numbers,
//! bytes as base64, timestamps as RFC 3339.
use base64::{engine::general_purpose::STANDARD, Engine};
use pillar_csi_proto::agent::v1 as pb;
use serde_json::Value;

/// The field `camel` (or its .proto name `snake`) of `object`.
fn field<'a>(object: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    object
        .get(camel)
        .or_else(|| object.get(snake))
        .filter(|v| !v.is_null())
}

fn string(object: &Value, camel: &str, snake: &str) -> Result<String, String> {
    match field(object, camel, snake) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{camel}: expected a string, found {other}")),
    }
}

fn boolean(object: &Value, camel: &str, snake: &str) -> Result<bool, String> {
    match field(object, camel, snake) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{camel}: expected true or false, found {other}")),
    }
}

fn uint64(object: &Value, camel: &str, snake: &str) -> Result<u64, String> {
    match field(object, camel, snake) {
        None => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|e| format!("{camel}: {s:?} is not an unsigned integer: {e}")),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("{camel}: {n} is not an unsigned integer")),
        Some(other) => Err(format!("{camel}: expected an integer, found {other}")),
    }
}

fn bytes(object: &Value, camel: &str, snake: &str) -> Result<Vec<u8>, String> {
    let text = string(object, camel, snake)?;
    // protojson accepts standard and URL-safe base64, padded or not.
    let normal: String = text
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    let padded = format!("{normal}{}", "=".repeat((4 - normal.len() % 4) % 4));
    STANDARD
        .decode(padded)
        .map_err(|e| format!("{camel}: not base64: {e}"))
}

fn enumeration(
    object: &Value,
    camel: &str,
    snake: &str,
    by_name: fn(&str) -> Option<i32>,
) -> Result<i32, String> {
    match field(object, camel, snake) {
        None => Ok(0),
        Some(Value::String(s)) => by_name(s).ok_or_else(|| format!("{camel}: unknown value {s:?}")),
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| format!("{camel}: {n} is not an enum number")),
        Some(other) => Err(format!("{camel}: expected an enum name, found {other}")),
    }
}

fn timestamp(
    object: &Value,
    camel: &str,
    snake: &str,
) -> Result<Option<prost_types::Timestamp>, String> {
    match field(object, camel, snake) {
        None => Ok(None),
        Some(Value::String(s)) => s
            .parse::<prost_types::Timestamp>()
            .map(Some)
            .map_err(|e| format!("{camel}: {s:?} is not an RFC 3339 time: {e}")),
        Some(other) => Err(format!(
            "{camel}: expected an RFC 3339 string, found {other}"
        )),
    }
}

fn list<'a>(object: &'a Value, camel: &str, snake: &str) -> Result<&'a [Value], String> {
    match field(object, camel, snake) {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("{camel}: expected a list, found {other}")),
    }
}

fn identity(v: &Value) -> Result<pb::LvmIdentity, String> {
    Ok(pb::LvmIdentity {
        volume_group: string(v, "volumeGroup", "volume_group")?,
        logical_volume: string(v, "logicalVolume", "logical_volume")?,
        volume_group_uuid: string(v, "volumeGroupUuid", "volume_group_uuid")?,
        logical_volume_uuid: string(v, "logicalVolumeUuid", "logical_volume_uuid")?,
    })
}

/// The snapshot of a RecoverySnapshot in proto3 JSON.
pub fn snapshot_from_json(v: &Value) -> Result<pb::RecoverySnapshot, String> {
    let exports = list(v, "exports", "exports")?
        .iter()
        .map(|x| {
            Ok(pb::VolumeExport {
                protocol_type: enumeration(x, "protocolType", "protocol_type", |s| {
                    pb::ProtocolType::from_str_name(s).map(|e| e as i32)
                })?,
                target_id: string(x, "targetId", "target_id")?,
                managed: boolean(x, "managed", "managed")?,
                allowed_hosts: list(x, "allowedHosts", "allowed_hosts")?
                    .iter()
                    .map(|h| {
                        h.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| format!("allowedHosts: {h} is not a string"))
                    })
                    .collect::<Result<_, String>>()?,
                allow_any_host: boolean(x, "allowAnyHost", "allow_any_host")?,
            })
        })
        .collect::<Result<_, String>>()?;
    let consumers = list(v, "consumers", "consumers")?
        .iter()
        .map(|c| {
            Ok(pb::VolumeConsumer {
                kind: string(c, "kind", "kind")?,
                device: string(c, "device", "device")?,
                detail: string(c, "detail", "detail")?,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(pb::RecoverySnapshot {
        volume_id: string(v, "volumeId", "volume_id")?,
        backend_type: enumeration(v, "backendType", "backend_type", |s| {
            pb::BackendType::from_str_name(s).map(|e| e as i32)
        })?,
        lvm_source: field(v, "lvmSource", "lvm_source")
            .map(identity)
            .transpose()?,
        old_volume_uid: string(v, "oldVolumeUid", "old_volume_uid")?,
        old_generation: uint64(v, "oldGeneration", "old_generation")?,
        preserve_original: boolean(v, "preserveOriginal", "preserve_original")?,
        exports,
        consumers,
        exclusive_claim: string(v, "exclusiveClaim", "exclusive_claim")?,
        agent_identity: string(v, "agentIdentity", "agent_identity")?,
        agent_certificate_sha256: bytes(v, "agentCertificateSha256", "agent_certificate_sha256")?,
        issued_at: timestamp(v, "issuedAt", "issued_at")?,
        signature: bytes(v, "signature", "signature")?,
    })
}

/// The `snapshot` of an InspectVolume answer in proto3 JSON.
pub fn snapshot_of_inspection(text: &str) -> Result<pb::RecoverySnapshot, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let snapshot = field(&v, "snapshot", "snapshot").ok_or(
        "the InspectVolume answer has no snapshot (the agent gives one only to a verified mTLS caller, with --recovery-trust-anchor, while a lifecycle of an adopted LV is live)",
    )?;
    snapshot_from_json(snapshot)
}

/// A snapshot as proto3 JSON with defaults printed (grpcurl
/// `-emit-defaults`): camelCase, enums by name, 64-bit integers as strings,
/// bytes as base64, the time in RFC 3339.
pub fn snapshot_to_json(s: &pb::RecoverySnapshot) -> Value {
    let enum_name = |n: i32, name: Option<&str>| match name {
        Some(name) => Value::from(name),
        None => Value::from(n),
    };
    let identity = |i: &pb::LvmIdentity| {
        serde_json::json!({
            "volumeGroup": i.volume_group,
            "logicalVolume": i.logical_volume,
            "volumeGroupUuid": i.volume_group_uuid,
            "logicalVolumeUuid": i.logical_volume_uuid,
        })
    };
    let mut v = serde_json::json!({
        "volumeId": s.volume_id,
        "backendType": enum_name(
            s.backend_type,
            pb::BackendType::try_from(s.backend_type).ok().map(|b| b.as_str_name())
        ),
        "oldVolumeUid": s.old_volume_uid,
        "oldGeneration": s.old_generation.to_string(),
        "preserveOriginal": s.preserve_original,
        "exports": s.exports.iter().map(|x| serde_json::json!({
            "protocolType": enum_name(
                x.protocol_type,
                pb::ProtocolType::try_from(x.protocol_type).ok().map(|p| p.as_str_name())
            ),
            "targetId": x.target_id,
            "managed": x.managed,
            "allowedHosts": x.allowed_hosts,
            "allowAnyHost": x.allow_any_host,
        })).collect::<Vec<_>>(),
        "consumers": s.consumers.iter().map(|c| serde_json::json!({
            "kind": c.kind, "device": c.device, "detail": c.detail,
        })).collect::<Vec<_>>(),
        "exclusiveClaim": s.exclusive_claim,
        "agentIdentity": s.agent_identity,
        "agentCertificateSha256": STANDARD.encode(&s.agent_certificate_sha256),
        "signature": STANDARD.encode(&s.signature),
    });
    if let Some(i) = &s.lvm_source {
        v["lvmSource"] = identity(i);
    }
    if let Some(t) = &s.issued_at {
        v["issuedAt"] = Value::from(t.to_string());
    }
    v
}

/// A whole InspectVolume answer as proto3 JSON with defaults printed
/// (grpcurl `-emit-defaults`, the form the spec's jq and `recovery sign`
/// read): camelCase, enums by name, 64-bit integers as strings, bytes as
/// base64, times in RFC 3339; absent message fields are left out.
pub fn inspection_to_json(r: &pb::InspectVolumeResponse) -> Value {
    let identity = |i: &pb::LvmIdentity| {
        serde_json::json!({
            "volumeGroup": i.volume_group,
            "logicalVolume": i.logical_volume,
            "volumeGroupUuid": i.volume_group_uuid,
            "logicalVolumeUuid": i.logical_volume_uuid,
        })
    };
    let protocol = |n: i32| match pb::ProtocolType::try_from(n) {
        Ok(p) => Value::from(p.as_str_name()),
        Err(_) => Value::from(n),
    };
    let mut v = serde_json::json!({
        "volumeId": r.volume_id,
        "filesystemProbeState": r.filesystem_probe_state,
        "filesystemType": r.filesystem_type,
        "consumers": r.consumers.iter().map(|c| serde_json::json!({
            "kind": c.kind, "device": c.device, "detail": c.detail,
        })).collect::<Vec<_>>(),
        "exports": r.exports.iter().map(|x| serde_json::json!({
            "protocolType": protocol(x.protocol_type),
            "targetId": x.target_id,
            "managed": x.managed,
            "allowedHosts": x.allowed_hosts,
            "allowAnyHost": x.allow_any_host,
        })).collect::<Vec<_>>(),
    });
    if let Some(l) = &r.lvm {
        let mut lvm = serde_json::json!({
            "exclusiveClaim": l.exclusive_claim,
            "sizeBytes": l.size_bytes.to_string(),
            "segtype": l.segtype,
            "lvAttr": l.lv_attr,
            "poolLv": l.pool_lv,
            "active": l.active,
            "devicePath": l.device_path,
            "layoutRefusal": l.layout_refusal,
        });
        if let Some(i) = &l.identity {
            lvm["identity"] = identity(i);
        }
        v["lvm"] = lvm;
    }
    if let Some(f) = &r.fence {
        let mut fence = serde_json::json!({
            "exists": f.exists,
            "ended": f.ended,
            "volumeUid": f.volume_uid,
            "generation": f.generation.to_string(),
            "preserveOriginal": f.preserve_original,
            "endedUids": f.ended_uids,
        });
        if let Some(i) = &f.lvm_source {
            fence["lvmSource"] = identity(i);
        }
        v["fence"] = fence;
    }
    if let Some(t) = &r.observed_at {
        v["observedAt"] = Value::from(t.to_string());
    }
    if let Some(s) = &r.snapshot {
        v["snapshot"] = snapshot_to_json(s);
    }
    v
}
