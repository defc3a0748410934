//! csi-sanity (kubernetes-csi/csi-test v5), the CSI conformance suite, run
//! against a controller socket and a node socket, and what it reported:
//! the counts of its Ginkgo summary and the failed specs of its JUnit
//! report. `scripts/deps.sh` builds the binary; `tests/lab/run` passes its
//! path as `PILLAR_LAB_CSI_SANITY`.
use crate::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One run's inputs.
#[derive(Debug, Clone)]
pub struct Run {
    /// The csi-sanity binary.
    pub binary: PathBuf,
    /// The Controller service's unix socket.
    pub controller: PathBuf,
    /// The Node (and Identity) service's unix socket.
    pub node: PathBuf,
    /// A folder for the suite's staging and target paths and reports.
    pub dir: PathBuf,
    /// CreateVolume's parameters (a StorageClass's, as the provisioner
    /// passes them).
    pub parameters: BTreeMap<String, String>,
    /// The size of the volumes it creates, and of its expansions.
    pub volume_bytes: u64,
}

/// What the suite reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Specs run.
    pub ran: u32,
    /// Specs in the suite.
    pub total: u32,
    /// Specs passed.
    pub passed: u32,
    /// Specs failed.
    pub failed: u32,
    /// Specs pending.
    pub pending: u32,
    /// Specs skipped (capabilities not advertised, or not selected).
    pub skipped: u32,
    /// The names of the failed specs, from the JUnit report.
    pub failures: Vec<String>,
    /// The summary lines as the suite printed them.
    pub summary: String,
}

/// Runs the suite; an error only when it could not run or report (failed
/// specs are in the [`Outcome`]). Its whole output is kept in
/// `dir/csi-sanity.log`.
pub fn run(r: &Run) -> Result<Outcome> {
    std::fs::create_dir_all(&r.dir)?;
    let params = r.dir.join("parameters.yaml");
    let yaml: String = r
        .parameters
        .iter()
        .map(|(k, v)| format!("{}: {}\n", quoted(k), quoted(v)))
        .collect();
    std::fs::write(&params, yaml)?;
    let junit = r.dir.join("junit.xml");
    let endpoint = |p: &Path| format!("unix://{}", p.display());
    let output = Command::new(&r.binary)
        .arg(format!("--csi.endpoint={}", endpoint(&r.node)))
        .arg(format!(
            "--csi.controllerendpoint={}",
            endpoint(&r.controller)
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            r.dir.join("staging").display()
        ))
        .arg(format!("--csi.mountdir={}", r.dir.join("target").display()))
        .arg(format!("--csi.testvolumeparameters={}", params.display()))
        .arg(format!("--csi.testvolumesize={}", r.volume_bytes))
        .arg(format!("--csi.testvolumeexpandsize={}", 2 * r.volume_bytes))
        .arg(format!("--csi.junitfile={}", junit.display()))
        .arg("--ginkgo.no-color")
        .output()
        .map_err(|e| format!("run {}: {e}", r.binary.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(r.dir.join("csi-sanity.log"), &text)?;
    let mut outcome = parse_summary(&text).ok_or_else(|| {
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        format!(
            "csi-sanity printed no summary (status {}); its last lines:\n{}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    })?;
    outcome.failures = failed_specs(&std::fs::read_to_string(&junit).unwrap_or_default());
    Ok(outcome)
}

/// A YAML double-quoted scalar.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The counts of Ginkgo's summary: `Ran N of M Specs in ...` and
/// `SUCCESS! -- P Passed | F Failed | X Pending | S Skipped` (or `FAIL!`).
pub fn parse_summary(text: &str) -> Option<Outcome> {
    let ran_line = text.lines().find(|l| l.trim_start().starts_with("Ran "))?;
    let words: Vec<&str> = ran_line.split_whitespace().collect();
    let (ran, total) = match words.as_slice() {
        ["Ran", ran, "of", total, "Specs", ..] => (ran.parse().ok()?, total.parse().ok()?),
        _ => return None,
    };
    let counts_line = text
        .lines()
        .find(|l| l.contains(" Passed | ") && l.contains(" Failed"))?;
    let count = |label: &str| -> Option<u32> {
        let counts = counts_line.rsplit("-- ").next()?;
        counts
            .split('|')
            .map(str::trim)
            .find_map(|c| c.strip_suffix(label).map(str::trim))?
            .parse()
            .ok()
    };
    Some(Outcome {
        ran,
        total,
        passed: count("Passed")?,
        failed: count("Failed")?,
        pending: count("Pending").unwrap_or(0),
        skipped: count("Skipped").unwrap_or(0),
        failures: Vec::new(),
        summary: format!("{}\n{}", ran_line.trim(), counts_line.trim()),
    })
}

/// The names of the `<testcase>`s of a JUnit report that hold a
/// `<failure>` (or an `<error>`).
pub fn failed_specs(junit: &str) -> Vec<String> {
    junit
        .split("<testcase ")
        .skip(1)
        .filter_map(|case| {
            let body = case.split("</testcase>").next().unwrap_or(case);
            if !(body.contains("<failure") || body.contains("<error")) {
                return None;
            }
            let name = body.split("name=\"").nth(1)?.split('"').next()?;
            Some(unescape(name))
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ginkgo_summaries_are_read() {
        let failing = "noise\nRan 56 of 92 Specs in 412.201 seconds\nFAIL! -- 37 Passed | 19 Failed | 1 Pending | 35 Skipped\n";
        let o = parse_summary(failing).expect("a failing summary");
        assert_eq!(
            (o.ran, o.total, o.passed, o.failed, o.pending, o.skipped),
            (56, 92, 37, 19, 1, 35)
        );
        let ok = "Ran 3 of 4 Specs in 1.0 seconds\nSUCCESS! -- 3 Passed | 0 Failed | 0 Pending | 1 Skipped\nPASS\n";
        let o = parse_summary(ok).expect("a passing summary");
        assert_eq!((o.passed, o.failed, o.skipped), (3, 0, 1));
        assert!(parse_summary("panic: no connection\n").is_none());
        assert!(parse_summary("Ran 3 of 4 Specs in 1.0 seconds\n").is_none());
    }

    #[test]
    fn junit_failures_are_named() {
        let junit = r#"<testsuites><testsuite>
<testcase name="[It] Node Service should work" classname="CSI"><system-out>x</system-out></testcase>
<testcase name="[It] Controller Service CreateVolume &quot;same name&quot;" classname="CSI"><failure message="m" type="failed">boom</failure></testcase>
<testcase name="[It] Node Service NodeStageVolume" classname="CSI"><error message="e"/></testcase>
<testcase name="[It] skipped" classname="CSI"><skipped message="s"/></testcase>
</testsuite></testsuites>"#;
        assert_eq!(
            failed_specs(junit),
            vec![
                "[It] Controller Service CreateVolume \"same name\"".to_owned(),
                "[It] Node Service NodeStageVolume".to_owned()
            ]
        );
        assert!(failed_specs("").is_empty());
    }
}
