//! Which LVs may be adopted, as `spec/adopt-lvm-lv.md` "Supported layouts"
//! says: linear or thin (of the backend's thin pool only) and active; every
//! other layout, and any LV whose type is unclear, is refused with a reason.
use super::report::{Lv, VolumeType};
use api::names::lvm::LvName;
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
        // The virtual origin of a sparse snapshot is also `o`.
        VolumeType::Origin if lv.layout.iter().any(|l| l == "virtual") => {
            return Err(Refusal::Virtual)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::lvm::report::{parse_lvs, LvAttr};

    /// `lvs -a --reportformat json --units b --nosuffix -o <LV fields>` of a
    /// VG holding every layout the lab can build, captured in the lab by
    /// `lvm_layouts_are_classified_as_the_spec_says` (lab-runs/*/lvm-layouts.json).
    const SAMPLE: &str = include_str!("testdata/layouts.json");

    fn sample() -> Vec<Lv> {
        let lines: Vec<String> = SAMPLE.lines().map(str::to_owned).collect();
        parse_lvs(&lines).unwrap()
    }

    fn find<'a>(lvs: &'a [Lv], name: &str) -> &'a Lv {
        lvs.iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("{name} is not in the sample"))
    }

    fn pool(name: &str) -> LvName {
        LvName::new(name).unwrap()
    }

    #[test]
    fn linear_and_thin_of_the_backend_pool_are_adoptable() {
        let lvs = sample();
        assert_eq!(classify(find(&lvs, "lin"), None), Ok(Adoptable::Linear));
        // `thin` is also the origin of a thin snapshot: still adoptable.
        assert_eq!(
            classify(find(&lvs, "thin"), Some(&pool("pool"))),
            Ok(Adoptable::Thin)
        );
        assert_eq!(
            classify(find(&lvs, "thin2"), Some(&pool("pool2"))),
            Ok(Adoptable::Thin)
        );
    }

    #[test]
    fn the_backend_decides_between_linear_and_thin() {
        let lvs = sample();
        assert_eq!(
            classify(find(&lvs, "lin"), Some(&pool("pool"))),
            Err(Refusal::LinearWithThinPool)
        );
        assert_eq!(
            classify(find(&lvs, "thin"), None),
            Err(Refusal::ThinWithoutPool)
        );
        assert_eq!(
            classify(find(&lvs, "thin2"), Some(&pool("pool"))),
            Err(Refusal::OtherThinPool {
                pool: "pool2".into(),
                backend_pool: "pool".into()
            })
        );
    }

    #[test]
    fn every_other_layout_is_refused_with_its_reason() {
        let lvs = sample();
        let p = pool("pool");
        let cases: &[(&str, Refusal)] = &[
            ("snap", Refusal::Snapshot),
            ("origin", Refusal::SnapshotOrigin),
            (
                "tsnap",
                Refusal::ThinSnapshot {
                    origin: "thin".into(),
                },
            ),
            ("pool", Refusal::ThinPool),
            ("pool_tdata", Refusal::ThinPoolData),
            ("pool_tmeta", Refusal::Metadata),
            ("lvol0_pmspare", Refusal::Metadata),
            ("mirror", Refusal::Mirror),
            ("mirror_mimage_0", Refusal::Mirror),
            ("raid", Refusal::Raid),
            ("raid_rimage_1", Refusal::Raid),
            ("raid_rmeta_0", Refusal::Metadata),
            ("sparse", Refusal::Snapshot),
            ("sparse_vorigin", Refusal::Virtual),
            ("cached", Refusal::Cache),
            ("cached_corig", Refusal::Cache),
            ("cpool_cpool", Refusal::Cache),
            ("cpool_cpool_cdata", Refusal::Cache),
            ("cpool_cpool_cmeta", Refusal::Metadata),
            (
                "striped",
                Refusal::NotLinear {
                    segtype: "striped".into(),
                },
            ),
        ];
        for (name, want) in cases {
            let lv = find(&lvs, name);
            assert_eq!(classify(lv, None).as_ref(), Err(want), "{name}");
            assert_eq!(classify(lv, Some(&p)).as_ref(), Err(want), "{name}");
        }
        assert_eq!(
            classify(find(&lvs, "inactive"), None),
            Err(Refusal::NotActive { state: '-' })
        );
        // Nothing in the sample but `lin` (no pool) and the thin LVs of the
        // backend's pool is adoptable, whatever the backend.
        for lv in &lvs {
            for backend in [None, Some(pool("pool")), Some(pool("pool2"))] {
                if classify(lv, backend.as_ref()).is_ok() {
                    assert!(
                        ["lin", "thin", "thin2"].contains(&lv.name.as_str()),
                        "{} adoptable with {backend:?}",
                        lv.name
                    );
                }
            }
        }
    }

    /// Layouts the lab cannot build (pvmove is transient, VDO needs its
    /// tools), an inactive LV, and reports that disagree with themselves:
    /// real rows of the sample with one column changed.
    #[test]
    fn derived_rows_pvmove_vdo_virtual_inactive_and_unclear() {
        let lvs = sample();
        let with_attr = |name: &str, attr: &str| {
            let mut lv = find(&lvs, name).clone();
            lv.attr = LvAttr::parse(attr).unwrap();
            lv
        };
        let refused = |lv: &Lv| classify(lv, None).unwrap_err();
        assert_eq!(refused(&with_attr("lin", "pwi-a-----")), Refusal::Pvmove);
        assert_eq!(refused(&with_attr("lin", "dwi-a-----")), Refusal::Vdo);
        assert_eq!(refused(&with_attr("lin", "Dwi-ao----")), Refusal::Vdo);
        assert_eq!(refused(&with_attr("lin", "vwi-a-v---")), Refusal::Virtual);
        assert_eq!(
            refused(&with_attr("lin", "-wi-------")),
            Refusal::NotActive { state: '-' }
        );
        assert_eq!(
            refused(&with_attr("lin", "-wi-s-----")),
            Refusal::NotActive { state: 's' }
        );
        assert!(matches!(
            refused(&with_attr("lin", "Zwi-a-----")),
            Refusal::Unclear { .. }
        ));
        assert!(matches!(
            refused(&with_attr("lin", "cwi-a-----")),
            Refusal::Unclear { .. }
        ));
        // lv_attr says thin, segtype says linear.
        assert!(matches!(
            refused(&with_attr("lin", "Vwi-a-tz--")),
            Refusal::Unclear { .. }
        ));
        // A plain, linear-looking LV whose layout is not linear.
        let mut odd = find(&lvs, "lin").clone();
        odd.layout = vec!["linear".into(), "striped".into()];
        assert!(matches!(refused(&odd), Refusal::Unclear { .. }));
        // A public-looking linear row that LVM marks private.
        let mut private = find(&lvs, "lin").clone();
        private.role = vec!["private".into()];
        assert!(matches!(refused(&private), Refusal::Unclear { .. }));
        // A thin LV without a pool is not clear.
        let mut poolless = find(&lvs, "thin").clone();
        poolless.pool_lv = None;
        assert!(matches!(
            classify(&poolless, Some(&pool("pool"))),
            Err(Refusal::Unclear { .. })
        ));
    }

    #[test]
    fn refusals_read_as_sentences() {
        assert_eq!(
            Refusal::OtherThinPool {
                pool: "p2".into(),
                backend_pool: "thin0".into()
            }
            .to_string(),
            "it is a thin LV of pool p2, not of the backend's pool thin0"
        );
        assert_eq!(
            Refusal::NotActive { state: '-' }.to_string(),
            "it is not active (lv_attr state '-')"
        );
    }
}
