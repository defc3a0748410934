//! `pillar-csi crds --out DIR`: writes the CRD YAML the Helm chart installs,
//! one file per CRD (`<plural>.pillar-csi.bhyoo.com.yaml`), generated from
//! the types in `api::crd`.
use clap::Args;
use std::path::{Path, PathBuf};

/// Arguments of `pillar-csi crds`.
#[derive(Args)]
pub struct CrdsArgs {
    /// The folder to write into (created if missing); the chart's is
    /// `charts/pillar-csi/files/crds`.
    #[arg(long)]
    out: PathBuf,
}

/// Every CRD as `(file name, YAML text)`.
pub fn rendered() -> Result<Vec<(String, String)>, String> {
    api::crd::crds()
        .iter()
        .map(|crd| {
            let yaml =
                api::crd::to_yaml(crd).map_err(|e| format!("{}: {e}", api::crd::file_name(crd)))?;
            Ok((api::crd::file_name(crd), yaml))
        })
        .collect()
}

/// Writes every CRD into `dir`, replacing files of the same name, and
/// prints each path written.
pub fn write(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    for (name, yaml) in rendered()? {
        let path = dir.join(name);
        std::fs::write(&path, yaml).map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

/// Runs the subcommand.
pub fn run(args: CrdsArgs) -> Result<(), String> {
    write(&args.out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Where the chart keeps the generated CRDs (relative to the repository).
    const CHART_CRDS: &str = "charts/pillar-csi/files/crds";

    /// The committed chart files are exactly what the types generate: run
    /// `cargo run -- crds --out charts/pillar-csi/files/crds` after changing
    /// a type.
    #[test]
    fn the_committed_crd_yaml_matches_the_types() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_CRDS);
        let mut expected: Vec<String> = Vec::new();
        for (name, yaml) in rendered().unwrap() {
            let path = dir.join(&name);
            let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; run `pillar-csi crds --out {CHART_CRDS}`",
                    path.display()
                )
            });
            assert!(
                committed == yaml,
                "{} drifted from the types in api/src/crd/; run `pillar-csi crds --out {CHART_CRDS}`",
                path.display()
            );
            expected.push(name);
        }
        let mut present: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".pillar-csi.bhyoo.com.yaml"))
            .collect();
        present.sort();
        expected.sort();
        assert_eq!(present, expected, "a CRD file no type generates");
    }

    #[test]
    fn write_creates_the_folder_and_one_file_per_crd() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("a/b");
        write(&out).unwrap();
        let n = std::fs::read_dir(&out).unwrap().count();
        assert_eq!(n, api::crd::crds().len());
        assert_eq!(n, 7);
        let yaml =
            std::fs::read_to_string(out.join("pillarvolumestates.pillar-csi.bhyoo.com.yaml"))
                .unwrap();
        assert!(yaml.contains("helm.sh/resource-policy: keep"), "{yaml}");
        assert!(yaml.contains("- pvst"), "{yaml}");
    }
}
