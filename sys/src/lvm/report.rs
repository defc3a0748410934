//! LVM's JSON reports (`--reportformat json --units b --nosuffix`) parsed
//! into typed VGs and LVs.
use api::names::lvm::{LvmUuid, VgName};
use serde::Deserialize;
use std::path::PathBuf;

/// The `vgs` fields requested, in the order of [`Vg`].
pub const VG_FIELDS: &str = "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size";
/// The `lvs` fields requested, in the order of [`Lv`].
pub const LV_FIELDS: &str = "vg_name,lv_name,vg_uuid,lv_uuid,lv_attr,segtype,pool_lv,origin,lv_size,data_percent,metadata_percent,lv_path,lv_layout,lv_role";

/// A volume group: identity and capacity in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vg {
    /// Its name.
    pub name: VgName,
    /// Its UUID.
    pub uuid: LvmUuid,
    /// Total size of its physical volumes usable for extents.
    pub size: u64,
    /// Bytes not allocated to any LV.
    pub free: u64,
    /// The extent size: every LV's size is a multiple of it.
    pub extent_size: u64,
}

/// A logical volume as `lvs -a` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Lv {
    /// Its VG's name.
    pub vg: VgName,
    /// Its name as LVM reports it, without the brackets LVM puts around the
    /// names of hidden (internal) LVs such as `thin0_tdata`.
    pub name: String,
    /// Whether LVM reports it hidden (an internal LV of a pool, mirror, RAID...).
    pub hidden: bool,
    /// Its VG's UUID.
    pub vg_uuid: LvmUuid,
    /// Its UUID.
    pub uuid: LvmUuid,
    /// `lv_attr`, decoded.
    pub attr: LvAttr,
    /// The segment type (`linear`, `striped`, `thin`, `thin-pool`, `snapshot`, ...).
    pub segtype: String,
    /// The thin or cache pool it lives in, if any.
    pub pool_lv: Option<String>,
    /// The origin of a snapshot, if any.
    pub origin: Option<String>,
    /// Its size in bytes (for a thin LV, its virtual size).
    pub size: u64,
    /// For thin pools and thin LVs, the share of data space used, in percent.
    pub data_percent: Option<f64>,
    /// For thin pools, the share of metadata space used, in percent.
    pub metadata_percent: Option<f64>,
    /// `/dev/<vg>/<lv>` for public LVs.
    pub path: Option<PathBuf>,
    /// `lv_layout`, split at commas (e.g. `linear`; `thin,sparse`; `thin,pool`).
    pub layout: Vec<String>,
    /// `lv_role`, split at commas (e.g. `public`; `private,thin,pool,data`).
    pub role: Vec<String>,
}

/// The first character of `lv_attr`: the volume type (lvs(8)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VolumeType {
    /// `-`: a plain LV (linear or striped).
    Plain,
    /// `C`: a cache, cache pool or writecache LV.
    Cache,
    /// `m`/`M`: a mirror (`M` without initial sync).
    Mirror,
    /// `o`/`O`: the origin of a classic snapshot (`O`: a snapshot merging into it).
    Origin,
    /// `r`/`R`: a RAID LV (`R` without initial sync).
    Raid,
    /// `s`/`S`: a classic snapshot (`S`: merging).
    Snapshot,
    /// `p`: a pvmove LV.
    Pvmove,
    /// `v`: a virtual LV (e.g. the virtual origin of a sparse snapshot).
    Virtual,
    /// `i`/`I`: a mirror or RAID image.
    Image,
    /// `l`: a mirror log.
    MirrorLog,
    /// `c`: an LV under conversion.
    UnderConversion,
    /// `V`: a thin LV.
    Thin,
    /// `t`: a thin pool.
    ThinPool,
    /// `T`: a thin pool's data LV.
    ThinPoolData,
    /// `d`: a VDO pool.
    VdoPool,
    /// `D`: a VDO pool's data LV.
    VdoPoolData,
    /// `e`: RAID or pool metadata, or a pool metadata spare.
    Metadata,
    /// A character this library does not know.
    Unknown(char),
}

impl VolumeType {
    fn from_char(c: char) -> Self {
        match c {
            '-' => Self::Plain,
            'C' => Self::Cache,
            'm' | 'M' => Self::Mirror,
            'o' | 'O' => Self::Origin,
            'r' | 'R' => Self::Raid,
            's' | 'S' => Self::Snapshot,
            'p' => Self::Pvmove,
            'v' => Self::Virtual,
            'i' | 'I' => Self::Image,
            'l' => Self::MirrorLog,
            'c' => Self::UnderConversion,
            'V' => Self::Thin,
            't' => Self::ThinPool,
            'T' => Self::ThinPoolData,
            'd' => Self::VdoPool,
            'D' => Self::VdoPoolData,
            'e' => Self::Metadata,
            other => Self::Unknown(other),
        }
    }
}

/// `lv_attr` decoded (the ten characters lvs(8) documents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvAttr {
    /// The attribute string as LVM printed it.
    pub raw: String,
    /// Character 1: the volume type.
    pub volume_type: VolumeType,
    /// Character 5 is `a`: the LV is active (its device exists).
    pub active: bool,
    /// Character 5: the state character (`a` active, `-` inactive, `s`
    /// suspended, `I` invalid snapshot, `X` unknown, ...).
    pub state: char,
    /// Character 6: `Some(true)` when the device is open, `None` when LVM
    /// could not tell (`X`).
    pub open: Option<bool>,
    /// Character 7: the target type (`-` linear/striped, `t` thin, `s`
    /// snapshot, `m` mirror, `r` RAID, `C` cache, `v` virtual, `u` unknown).
    pub target_type: char,
}

impl LvAttr {
    /// Decodes an `lv_attr` string; `None` when it is not ten characters long.
    pub fn parse(raw: &str) -> Option<Self> {
        let c: Vec<char> = raw.chars().collect();
        if c.len() != 10 {
            return None;
        }
        Some(Self {
            raw: raw.to_owned(),
            volume_type: VolumeType::from_char(c[0]),
            active: c[4] == 'a',
            state: c[4],
            open: match c[5] {
                'o' => Some(true),
                '-' => Some(false),
                _ => None,
            },
            target_type: c[6],
        })
    }
}

/// Why a report could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReportError(pub String);

#[derive(Deserialize)]
struct Report<T> {
    report: Vec<Section<T>>,
}

#[derive(Deserialize)]
#[serde(bound = "T: Deserialize<'de>")]
struct Section<T> {
    #[serde(default)]
    vg: Vec<T>,
    #[serde(default)]
    lv: Vec<T>,
}

#[derive(Deserialize)]
struct RawVg {
    vg_name: String,
    vg_uuid: String,
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
}

#[derive(Deserialize)]
struct RawLv {
    vg_name: String,
    lv_name: String,
    vg_uuid: String,
    lv_uuid: String,
    lv_attr: String,
    segtype: String,
    pool_lv: String,
    origin: String,
    lv_size: String,
    data_percent: String,
    metadata_percent: String,
    lv_path: String,
    lv_layout: String,
    lv_role: String,
}

/// The JSON document in LVM's output lines: from the first line that opens
/// an object to the last line that closes one (warnings LVM prints around a
/// report are left out).
fn json_text(lines: &[String]) -> Result<String, ReportError> {
    let start = lines.iter().position(|l| l.trim_start().starts_with('{'));
    let end = lines.iter().rposition(|l| l.trim_end().ends_with('}'));
    match (start, end) {
        (Some(s), Some(e)) if s <= e => Ok(lines[s..=e].join("\n")),
        _ => Err(ReportError(format!(
            "no JSON report in LVM's output: {:?}",
            lines.join("\n")
        ))),
    }
}

fn sections<T: for<'de> Deserialize<'de>>(
    lines: &[String],
) -> Result<Vec<Section<T>>, ReportError> {
    let text = json_text(lines)?;
    serde_json::from_str::<Report<T>>(&text)
        .map(|r| r.report)
        .map_err(|e| ReportError(format!("unreadable JSON report ({e}): {text:?}")))
}

fn bytes(field: &str, value: &str) -> Result<u64, ReportError> {
    value
        .parse()
        .map_err(|_| ReportError(format!("{field} {value:?} is not a byte count")))
}

fn percent(field: &str, value: &str) -> Result<Option<f64>, ReportError> {
    if value.is_empty() {
        return Ok(None);
    }
    value
        .parse()
        .map(Some)
        .map_err(|_| ReportError(format!("{field} {value:?} is not a percentage")))
}

fn nonempty(value: String) -> Option<String> {
    (!value.is_empty()).then_some(value)
}

fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses the output lines of `vgs --reportformat json --units b --nosuffix
/// -o` [`VG_FIELDS`].
pub fn parse_vgs(lines: &[String]) -> Result<Vec<Vg>, ReportError> {
    let mut out = Vec::new();
    for section in sections::<RawVg>(lines)? {
        for raw in section.vg {
            out.push(Vg {
                name: VgName::new(&raw.vg_name).map_err(|e| ReportError(e.to_string()))?,
                uuid: LvmUuid::new(&raw.vg_uuid).map_err(|e| ReportError(e.to_string()))?,
                size: bytes("vg_size", &raw.vg_size)?,
                free: bytes("vg_free", &raw.vg_free)?,
                extent_size: bytes("vg_extent_size", &raw.vg_extent_size)?,
            });
        }
    }
    Ok(out)
}

/// Parses the output lines of `lvs -a --reportformat json --units b
/// --nosuffix -o` [`LV_FIELDS`].
pub fn parse_lvs(lines: &[String]) -> Result<Vec<Lv>, ReportError> {
    let mut out = Vec::new();
    for section in sections::<RawLv>(lines)? {
        for raw in section.lv {
            let (name, hidden) = match raw
                .lv_name
                .strip_prefix('[')
                .and_then(|n| n.strip_suffix(']'))
            {
                Some(inner) => (inner.to_owned(), true),
                None => (raw.lv_name.clone(), false),
            };
            let attr = LvAttr::parse(&raw.lv_attr).ok_or_else(|| {
                ReportError(format!(
                    "LV {}/{}: lv_attr {:?} is not ten characters",
                    raw.vg_name, raw.lv_name, raw.lv_attr
                ))
            })?;
            let strip = |s: String| {
                nonempty(s).map(|s| {
                    s.strip_prefix('[')
                        .and_then(|n| n.strip_suffix(']'))
                        .map(str::to_owned)
                        .unwrap_or(s)
                })
            };
            out.push(Lv {
                vg: VgName::new(&raw.vg_name).map_err(|e| ReportError(e.to_string()))?,
                hidden,
                vg_uuid: LvmUuid::new(&raw.vg_uuid).map_err(|e| ReportError(e.to_string()))?,
                uuid: LvmUuid::new(&raw.lv_uuid).map_err(|e| ReportError(e.to_string()))?,
                attr,
                segtype: raw.segtype,
                pool_lv: strip(raw.pool_lv),
                origin: strip(raw.origin),
                size: bytes("lv_size", &raw.lv_size)?,
                data_percent: percent("data_percent", &raw.data_percent)?,
                metadata_percent: percent("metadata_percent", &raw.metadata_percent)?,
                path: nonempty(raw.lv_path).map(PathBuf::from),
                layout: split_list(&raw.lv_layout),
                role: split_list(&raw.lv_role),
                name,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LAYOUTS: &str = include_str!("testdata/layouts.json");

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn lv_reports_parse_into_typed_values() {
        let lvs = parse_lvs(&lines(LAYOUTS)).unwrap();
        let rows = serde_json::from_str::<serde_json::Value>(LAYOUTS).unwrap()["report"][0]["lv"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(lvs.len(), rows);
        let lin = lvs.iter().find(|l| l.name == "lin").unwrap();
        assert_eq!(
            (lin.size, lin.segtype.as_str(), lin.hidden),
            (8 << 20, "linear", false)
        );
        assert_eq!(lin.attr.volume_type, VolumeType::Plain);
        assert!(lin.attr.active);
        assert_eq!(lin.attr.open, Some(false));
        assert_eq!(lin.layout, ["linear"]);
        assert_eq!(lin.role, ["public"]);
        assert_eq!(lin.data_percent, None);
        assert!(lin.path.as_ref().unwrap().ends_with("lin"));
        assert_eq!(lin.vg_uuid, lvs[0].vg_uuid);

        let tdata = lvs.iter().find(|l| l.name == "pool_tdata").unwrap();
        assert!(tdata.hidden && tdata.path.is_none());
        assert_eq!(tdata.attr.volume_type, VolumeType::ThinPoolData);
        assert_eq!(tdata.attr.open, Some(true));

        let pool = lvs.iter().find(|l| l.name == "pool").unwrap();
        assert_eq!(pool.attr.volume_type, VolumeType::ThinPool);
        assert_eq!(pool.data_percent, Some(0.0));
        assert!(pool.metadata_percent.unwrap() > 0.0);

        let thin = lvs.iter().find(|l| l.name == "thin").unwrap();
        assert_eq!(thin.pool_lv.as_deref(), Some("pool"));
        assert_eq!(thin.attr.target_type, 't');
        let tsnap = lvs.iter().find(|l| l.name == "tsnap").unwrap();
        assert_eq!(tsnap.origin.as_deref(), Some("thin"));
        // Brackets of hidden LVs are taken off references too.
        let cached = lvs.iter().find(|l| l.name == "cached").unwrap();
        assert_eq!(cached.pool_lv.as_deref(), Some("cpool_cpool"));
        assert_eq!(cached.origin.as_deref(), Some("cached_corig"));
        assert!(cached.data_percent.is_some() && cached.metadata_percent.unwrap() > 0.0);
    }

    #[test]
    fn warnings_around_a_report_are_ignored_and_garbage_is_an_error() {
        let mut l = vec!["  WARNING: something LVM wanted to say".to_owned()];
        l.extend(lines(LAYOUTS));
        l.push("  WARNING: and after".to_owned());
        assert_eq!(
            parse_lvs(&l).unwrap().len(),
            parse_lvs(&lines(LAYOUTS)).unwrap().len()
        );

        assert!(parse_lvs(&["no report here".to_owned()]).is_err());
        let bad_size = LAYOUTS.replacen("\"lv_size\":\"8388608\"", "\"lv_size\":\"8.00m\"", 1);
        let err = parse_lvs(&lines(&bad_size)).unwrap_err();
        assert!(err.to_string().contains("lv_size \"8.00m\""), "{err}");
        let bad_attr = LAYOUTS.replacen("\"lv_attr\":\"-wi-a-----\"", "\"lv_attr\":\"-wi\"", 1);
        assert!(parse_lvs(&lines(&bad_attr)).is_err());
        let missing = LAYOUTS.replace("\"segtype\":", "\"segtypo\":");
        assert!(parse_lvs(&lines(&missing)).is_err());
    }

    #[test]
    fn vg_reports_parse_into_typed_values() {
        // `vgs` of two VGs, captured in the lab.
        let text = include_str!("testdata/vgs.json");
        let vgs = parse_vgs(&lines(text)).unwrap();
        let doc: serde_json::Value = serde_json::from_str(text).unwrap();
        let rows = doc["report"][0]["vg"].as_array().unwrap();
        assert_eq!(vgs.len(), rows.len());
        assert!(vgs.len() >= 2);
        for (vg, row) in vgs.iter().zip(rows) {
            assert_eq!(vg.name.as_str(), row["vg_name"]);
            assert_eq!(vg.uuid.as_str(), row["vg_uuid"]);
            assert_eq!(vg.size.to_string(), row["vg_size"]);
            assert_eq!(vg.free.to_string(), row["vg_free"]);
            assert_eq!(vg.extent_size, 4 << 20);
            assert!(vg.free <= vg.size);
        }
    }

    #[test]
    fn attrs_decode_per_lvs_8() {
        let a = LvAttr::parse("Vwi---tz-k").unwrap();
        assert_eq!(a.volume_type, VolumeType::Thin);
        assert!(!a.active);
        assert_eq!((a.state, a.open, a.target_type), ('-', Some(false), 't'));
        let a = LvAttr::parse("owi-aoC---").unwrap();
        assert_eq!(
            (a.volume_type, a.active, a.open),
            (VolumeType::Origin, true, Some(true))
        );
        assert_eq!(LvAttr::parse("-wi-aX----").unwrap().open, None);
        assert_eq!(
            LvAttr::parse("?wi-a-----").unwrap().volume_type,
            VolumeType::Unknown('?')
        );
        assert!(LvAttr::parse("-wi-a----").is_none());
    }
}
