//! The operator's guides run (issue 45): every `sh` block of `docs/`, in
//! the order of a reader who installs pillar-csi and then follows each
//! guide, runs in bash against the guide world (the real agent, controller,
//! CSI sidecars, node plugin and kube-controller-manager with the lab's API
//! server; [`pillar_csi_lab::guide_world`]), and its output is checked
//! against the `text` block the guide shows after it. A block marked
//! `<!-- not run: why -->` is counted, with why; where such a block does
//! something the next blocks rely on (`helm install`), the world does it.
//! The set-up an operator does outside the guides runs at the headings
//! named in [`HOOKS`]. A guide that drifts from the code fails here.
//!
//! Run with `tests/lab/run tests -- claim_guides`.
use pillar_csi_lab::{
    guide_world::GuideWorld,
    guides::{check_output, Guide, Step},
    Result,
};
use std::{fs, path::Path};

/// The guides in a reader's order: install first, then the tasks on the
/// cluster it made; the guides without runnable blocks are counted too.
const ORDER: [&str; 12] = [
    "install.md",
    "architecture.md",
    "fencing.md",
    "import-zvol.md",
    "adopt-lv.md",
    "recovery.md",
    "troubleshooting.md",
    "upgrade.md",
    "metrics.md",
    "performance.md",
    "libraries.md",
    "development.md",
];

/// Where the world acts between a guide's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// At the heading of this title.
    Heading(&'static str),
    /// In place of the not-run block that contains this text.
    NotRun(&'static str),
}

/// What the world does there.
#[derive(Debug, Clone, Copy)]
enum Action {
    /// The chart's processes and objects (`helm install`).
    Install,
    /// A set-up script of `tests/lab/guide-world/`.
    Setup(&'static str),
    /// The agent's `.proto` file into `proto/`.
    Proto,
    /// The cluster's records of vg0/legacy lost while no controller runs.
    MetadataLost,
    /// The agent restarted with this flag (`helm upgrade` of `agent.extraArgs`).
    AgentFlag(&'static str),
}

/// The world's actions, by guide and place.
const HOOKS: [(&str, Place, Action); 9] = [
    (
        "install.md",
        Place::NotRun("helm install pillar-csi"),
        Action::Install,
    ),
    (
        "import-zvol.md",
        Place::Heading("Move one volume"),
        Action::Setup("old-driver-zvol.sh"),
    ),
    (
        "import-zvol.md",
        Place::Heading("The way back"),
        Action::Setup("snapshot-kept.sh"),
    ),
    (
        "adopt-lv.md",
        Place::Heading("Adopt one LV"),
        Action::Setup("legacy-lv.sh"),
    ),
    (
        "adopt-lv.md",
        Place::Heading("The .proto file"),
        Action::Setup("client-cert.sh"),
    ),
    (
        "adopt-lv.md",
        Place::NotRun("curl -fsSL -o proto/"),
        Action::Proto,
    ),
    (
        "adopt-lv.md",
        Place::Heading("Rebind a retained volume"),
        Action::Setup("claim-deleted.sh"),
    ),
    (
        "recovery.md",
        Place::NotRun("--recovery-trust-anchor="),
        Action::AgentFlag(
            "--recovery-trust-anchor=/var/lib/pillar-csi/agent/recovery-trust-anchor.pem",
        ),
    ),
    (
        "recovery.md",
        Place::Heading("The procedure"),
        Action::MetadataLost,
    ),
];

/// The world follows the install guide's "without cert-manager" path, so
/// the agent's Secret has the name the guides give for that path.
const SUBSTITUTIONS: [(&str, &str); 1] = [("pillar-csi-agent-mtls", "pillar-agent-mtls")];

fn docs() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs"))
}

async fn act(world: &mut GuideWorld, action: Action) -> Result<()> {
    match action {
        Action::Install => world.install().await,
        Action::Setup(script) => world.setup(script, &[]).await.map(|_| ()),
        Action::Proto => {
            let proto = docs().join("../proto/pillar_csi/agent/v1/agent.proto");
            world
                .setup("proto.sh", &[&proto.to_string_lossy()])
                .await
                .map(|_| ())
        }
        Action::MetadataLost => {
            world.stop_controller().await;
            world.setup("metadata-lost.sh", &[]).await?;
            world.follow_controller_deployment().await
        }
        Action::AgentFlag(flag) => world.restart_agent_with(flag).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_guides_commands_run_against_the_code_they_describe() -> Result<()> {
    let mut guides: Vec<String> = fs::read_dir(docs())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    guides.sort();
    let mut order = ORDER.to_vec();
    order.sort_unstable();
    assert_eq!(guides, order, "ORDER names every guide of docs/ once");
    let mut world = GuideWorld::prepare().await?;
    let mut used = vec![false; HOOKS.len()];
    let (mut ran, mut not_run) = (0, Vec::new());
    // What each step did, also written to `guides.report` in the lab's work
    // folder (a passing test's output is not shown).
    let mut report = Vec::new();
    for name in ORDER {
        let guide = Guide::parse(name, &fs::read_to_string(docs().join(name))?)?;
        report.push(name.to_owned());
        for step in &guide.steps {
            for (i, (g, at, action)) in HOOKS.iter().enumerate() {
                let here = match (at, step) {
                    (Place::Heading(t), Step::Heading(title)) => t == title,
                    (Place::NotRun(text), Step::NotRun { block, .. }) => {
                        block.script.contains(text)
                    }
                    _ => false,
                };
                if *g == name && here {
                    report.push(format!("  [world] {action:?}"));
                    act(&mut world, *action)
                        .await
                        .map_err(|e| format!("{name}: the world's {action:?} failed: {e}"))?;
                    used[i] = true;
                }
            }
            match step {
                Step::Heading(_) => {}
                Step::File { name: file, text } => fs::write(world.dir.join(file), text)?,
                Step::NotRun { block, why } => {
                    report.push(format!("  {name}:{} not run: {why}", block.line));
                    not_run.push(format!("{name}:{}", block.line));
                }
                Step::Run(block) => {
                    let mut script = block.script.clone();
                    for (from, to) in SUBSTITUTIONS {
                        script = script.replace(from, to);
                    }
                    let out = world.run(&script).await?;
                    let text = format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    if !out.status.success() {
                        return Err(format!(
                            "{name}:{}: the block failed ({}):\n{}\n---- its output ----\n{text}\n{}",
                            block.line,
                            out.status,
                            block.script,
                            world.logs()
                        )
                        .into());
                    }
                    check_output(&block.expect, &text)
                        .map_err(|e| format!("{name}:{}: {e}\n{}", block.line, world.logs()))?;
                    ran += 1;
                    report.push(format!(
                        "  {name}:{} ok{}",
                        block.line,
                        if block.expect.is_empty() {
                            String::new()
                        } else {
                            format!(" ({} expected lines)", block.expect.len())
                        }
                    ));
                }
            }
        }
    }
    for (i, (guide, place, action)) in HOOKS.iter().enumerate() {
        assert!(
            used[i],
            "{guide} has no place {place:?} for the world's {action:?} any more"
        );
    }
    report.push(format!(
        "guides: {ran} blocks run, {} marked not run ({})",
        not_run.len(),
        not_run.join(", ")
    ));
    let report = report.join("\n");
    println!("{report}");
    fs::write(world.lab.work.join("guides.report"), report + "\n")?;
    world.clean_up().await
}
