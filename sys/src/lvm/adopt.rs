//! Which LVs may be adopted, as `spec/adopt-lvm-lv.md` "Supported layouts"
//! says: linear or thin (of the backend's thin pool only) and active; every
//! other layout, and any LV whose type is unclear, is refused with a reason.
use super::names::LvName;
use super::report::{Lv, VolumeType};
use std::fmt;

/// The kind of an adoptable LV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoptable {
    /// A linear LV (backend without a thin pool).
    Linear,
    /// A thin LV of the backend's thin pool.
    Thin,
}

/// Why an LV cannot be adopted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A classic (COW) snapshot.
    Snapshot,
    /// A thin snapshot (a thin LV with an origin).
    ThinSnapshot {
        /// Its origin.
        origin: String,
    },
    /// The origin of a classic snapshot.
    SnapshotOrigin,
    /// A thin pool.
    ThinPool,
    /// A thin pool's data LV.
    ThinPoolData,
    /// Pool or RAID metadata, or a pool metadata spare.
    Metadata,
    /// A mirror, one of its images or its log.
    Mirror,
    /// A RAID LV or one of its images.
    Raid,
    /// A pvmove LV.
    Pvmove,
    /// A virtual LV.
    Virtual,
    /// A cache, cache pool or writecache LV, or an LV in a cache pool.
    Cache,
    /// A VDO pool, its data LV or a VDO LV.
    Vdo,
    /// A plain LV that is not linear (e.g. striped).
    NotLinear {
        /// Its segment type.
        segtype: String,
    },
    /// A thin LV while the backend has no thin pool (it adopts linear LVs only).
    ThinWithoutPool,
    /// A thin LV of another thin pool than the backend's.
    OtherThinPool {
        /// The pool it lives in.
        pool: String,
        /// The backend's pool.
        backend_pool: String,
    },
    /// A linear LV while the backend has a thin pool (it adopts thin LVs of that pool only).
    LinearWithThinPool,
    /// The LV is not active (import never activates it).
    NotActive {
        /// `lv_attr`'s state character.
        state: char,
    },
    /// The report does not say clearly what the LV is.
    Unclear {
        /// What is unclear.
        why: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Snapshot => write!(f, "it is a snapshot"),
            Refusal::ThinSnapshot { origin } => write!(f, "it is a thin snapshot of {origin}"),
            Refusal::SnapshotOrigin => write!(f, "it is the origin of a snapshot"),
            Refusal::ThinPool => write!(f, "it is a thin pool"),
            Refusal::ThinPoolData => write!(f, "it is the data LV of a thin pool"),
            Refusal::Metadata => write!(f, "it is a pool or RAID metadata LV"),
            Refusal::Mirror => write!(f, "it is a mirror or part of one"),
            Refusal::Raid => write!(f, "it is a RAID LV or part of one"),
            Refusal::Pvmove => write!(f, "it is a pvmove LV"),
            Refusal::Virtual => write!(f, "it is a virtual LV"),
            Refusal::Cache => write!(f, "it is a cache LV (not supported)"),
            Refusal::Vdo => write!(f, "it is a VDO LV (not supported)"),
            Refusal::NotLinear { segtype } => write!(f, "it is {segtype}, not linear"),
            Refusal::ThinWithoutPool => {
                write!(f, "it is a thin LV and the backend has no thin pool")
            }
            Refusal::OtherThinPool { pool, backend_pool } => write!(
                f,
                "it is a thin LV of pool {pool}, not of the backend's pool {backend_pool}"
            ),
            Refusal::LinearWithThinPool => write!(
                f,
                "it is a linear LV and the backend adopts thin LVs of its thin pool only"
            ),
            Refusal::NotActive { state } => {
                write!(f, "it is not active (lv_attr state {state:?})")
            }
            Refusal::Unclear { why } => write!(f, "its type is unclear: {why}"),
        }
    }
}

/// Classifies `lv` for adoption by a backend whose thin pool is
/// `thin_pool` (`None`: a backend without a thin pool, which adopts linear
/// LVs only). Pure: it reads only the report.
///
/// The type is taken from `lv_attr`'s first character and must agree with
/// the segment type, target type, layout and role; any disagreement, an
/// unknown character or a hidden LV is [`Refusal::Unclear`] or refused as
/// what it is. The size against a request and idleness are the caller's
/// checks.
pub fn classify(lv: &Lv, thin_pool: Option<&LvName>) -> Result<Adoptable, Refusal> {
    let unclear = |why: String| Refusal::Unclear { why };
    let kind = match lv.attr.volume_type {
        VolumeType::Snapshot => return Err(Refusal::Snapshot),
        // A cache's origin is also `o`; its role says it is a cache part.
        VolumeType::Origin if lv.role.iter().any(|r| r == "cache" || r == "cacheorigin") => {
            return Err(Refusal::Cache)
        }
        VolumeType::Origin => return Err(Refusal::SnapshotOrigin),
        VolumeType::ThinPool => return Err(Refusal::ThinPool),
        VolumeType::ThinPoolData => return Err(Refusal::ThinPoolData),
        VolumeType::Metadata => return Err(Refusal::Metadata),
        VolumeType::Mirror | VolumeType::MirrorLog => return Err(Refusal::Mirror),
        VolumeType::Raid => return Err(Refusal::Raid),
        VolumeType::Image => {
            return Err(
                if lv.segtype.starts_with("raid") || lv.name.contains("_rimage") {
                    Refusal::Raid
                } else {
                    Refusal::Mirror
                },
            )
        }
        VolumeType::Pvmove => return Err(Refusal::Pvmove),
        VolumeType::Virtual => return Err(Refusal::Virtual),
        VolumeType::Cache => return Err(Refusal::Cache),
        VolumeType::VdoPool | VolumeType::VdoPoolData => return Err(Refusal::Vdo),
        VolumeType::UnderConversion => {
            return Err(unclear("it is under conversion (lv_attr 'c')".into()))
        }
        VolumeType::Unknown(c) => {
            return Err(unclear(format!(
                "unknown volume type {c:?} in lv_attr {:?}",
                lv.attr.raw
            )))
        }
        VolumeType::Plain => match lv.segtype.as_str() {
            "linear" => Adoptable::Linear,
            "vdo" => return Err(Refusal::Vdo),
            s if s.starts_with("cache") || s == "writecache" => return Err(Refusal::Cache),
            "zero" | "error" => return Err(Refusal::Virtual),
            other => {
                return Err(Refusal::NotLinear {
                    segtype: other.to_owned(),
                })
            }
        },
        VolumeType::Thin => {
            if lv.segtype != "thin" {
                return Err(unclear(format!(
                    "lv_attr {:?} says thin, segtype says {:?}",
                    lv.attr.raw, lv.segtype
                )));
            }
            if let Some(origin) = &lv.origin {
                return Err(Refusal::ThinSnapshot {
                    origin: origin.clone(),
                });
            }
            Adoptable::Thin
        }
    };
    // Everything below is a linear or thin LV by lv_attr and segtype; the
    // other columns must agree, or the type is not reported clearly.
    if lv.hidden || lv.role.iter().any(|r| r == "private") {
        return Err(unclear(format!(
            "it is an internal LV (role {:?})",
            lv.role.join(",")
        )));
    }
    if lv.role.iter().any(|r| r == "snapshot") {
        return Err(match &lv.origin {
            Some(origin) => Refusal::ThinSnapshot {
                origin: origin.clone(),
            },
            None => Refusal::Snapshot,
        });
    }
    if lv.role.iter().any(|r| r == "origin") && kind == Adoptable::Linear {
        return Err(Refusal::SnapshotOrigin);
    }
    let layout_ok = match kind {
        Adoptable::Linear => lv.layout == ["linear"],
        Adoptable::Thin => lv.layout.iter().any(|l| l == "thin") && lv.pool_lv.is_some(),
    };
    if !layout_ok || lv.origin.is_some() {
        return Err(unclear(format!(
            "lv_attr {:?} and segtype {:?} disagree with layout {:?}, pool {:?}, origin {:?}",
            lv.attr.raw,
            lv.segtype,
            lv.layout.join(","),
            lv.pool_lv,
            lv.origin
        )));
    }
    match (kind, thin_pool) {
        (Adoptable::Linear, Some(_)) => return Err(Refusal::LinearWithThinPool),
        (Adoptable::Thin, None) => return Err(Refusal::ThinWithoutPool),
        (Adoptable::Thin, Some(pool)) if lv.pool_lv.as_deref() != Some(pool.as_str()) => {
            return Err(Refusal::OtherThinPool {
                pool: lv.pool_lv.clone().unwrap_or_default(),
                backend_pool: pool.to_string(),
            })
        }
        _ => {}
    }
    if !lv.attr.active {
        return Err(Refusal::NotActive {
            state: lv.attr.state,
        });
    }
    Ok(kind)
}
