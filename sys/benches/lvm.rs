//! `sys::lvm` against the LVM CLI, in the kernel lab
//! (`tests/lab/run bench -- lvm`). Under TCG absolute times mean little, so
//! each figure is compared with the other way of doing the same work in the
//! same run, as a ratio:
//!
//! - 50 linear LV create + remove pairs through `sys::lvm` (one handle, one
//!   worker) against `lvcreate` + `lvremove` processes;
//! - 200 JSON reports of the VG's LVs through `sys::lvm` (parsed into typed
//!   values) against `lvs` processes (their output parsed with serde_json).
use pillar_csi_lab::{run, Lab};
use std::time::{Duration, Instant};
use sys::lvm::{LvName, Lvm, VgName};

const PAIRS: usize = 50;
const REPORTS: usize = 200;
const FIELDS: &str = "vg_name,lv_name,vg_uuid,lv_uuid,lv_attr,segtype,pool_lv,origin,lv_size,data_percent,metadata_percent,lv_path,lv_layout,lv_role";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filters.is_empty() && !filters.iter().any(|f| "lvm".contains(f.as_str())) {
        return Ok(());
    }
    let lab = Lab::get();
    let vg = VgName::new(&lab.vg)?;
    let lvm = Lvm::start()?;
    let size = 4u64 << 20;

    // Warm both paths (page cache, udev, modules) before timing.
    for i in 0..2 {
        let n = LvName::new(&lab.unique(&format!("warm{i}")))?;
        let lv = lvm.create_linear(&vg, &n, size)?;
        lvm.remove(&vg, &n, &lv.uuid)?;
        let path = format!("{}/{n}", lab.vg);
        run("lvcreate", &["-y", "-n", n.as_str(), "-L", "4m", &lab.vg])?;
        run("lvremove", &["-y", &path])?;
    }

    // Create + remove, alternating blocks of 10 so drift hits both sides.
    let (mut ours, mut theirs) = (Duration::ZERO, Duration::ZERO);
    let mut create_part = Duration::ZERO;
    for block in 0..PAIRS / 10 {
        let t = Instant::now();
        for i in 0..10 {
            let n = LvName::new(&lab.unique(&format!("bl{block}-{i}")))?;
            let c = Instant::now();
            let lv = lvm.create_linear(&vg, &n, size)?;
            create_part += c.elapsed();
            lvm.remove(&vg, &n, &lv.uuid)?;
        }
        ours += t.elapsed();
        let t = Instant::now();
        for i in 0..10 {
            let n = lab.unique(&format!("bc{block}-{i}"));
            run("lvcreate", &["-y", "-n", &n, "-L", "4m", &lab.vg])?;
            run("lvremove", &["-y", &format!("{}/{n}", lab.vg)])?;
        }
        theirs += t.elapsed();
    }

    // Let udev finish the events of the creates and removes, so that their
    // work does not land in the report timings of either side.
    let _ = run("udevadm", &["settle"]);

    // The cost of one in-process report of one LV (the read-back a create
    // does to return the new LV with its UUID).
    let thin = LvName::new(&lab.thin_pool)?;
    let t = Instant::now();
    for _ in 0..20 {
        lvm.lv(&vg, &thin)?;
    }
    let one_lv_report = t.elapsed() / 20;

    // Reports: typed values in-process against `lvs` processes + serde_json.
    let (mut rep_ours, mut rep_theirs) = (Duration::ZERO, Duration::ZERO);
    let mut seen = (0, 0);
    for _ in 0..REPORTS / 20 {
        let t = Instant::now();
        for _ in 0..20 {
            seen.0 = lvm.lvs(&vg)?.len();
        }
        rep_ours += t.elapsed();
        let t = Instant::now();
        for _ in 0..20 {
            let out = run(
                "lvs",
                &[
                    "-a",
                    "--reportformat",
                    "json",
                    "--units",
                    "b",
                    "--nosuffix",
                    "-o",
                    FIELDS,
                    &lab.vg,
                ],
            )?;
            let doc: serde_json::Value = serde_json::from_str(&out)?;
            seen.1 = doc["report"][0]["lv"].as_array().map_or(0, Vec::len);
        }
        rep_theirs += t.elapsed();
    }
    if seen.0 != seen.1 {
        return Err(format!("the two ways saw {} and {} LVs", seen.0, seen.1).into());
    }

    let pair_ratio = theirs.as_secs_f64() / ours.as_secs_f64();
    let rep_ratio = rep_theirs.as_secs_f64() / rep_ours.as_secs_f64();
    println!("lvm bench (lab guest under TCG; compare ratios, not times)");
    println!(
        "  create+remove x{PAIRS}: sys::lvm {:.0} ms ({:.1} ms/pair; create {:.1} ms (one lvcreate plus a sysfs read of the new device; an LVM report of one LV would add ~{:.1} ms)), lvcreate+lvremove processes {:.0} ms ({:.1} ms/pair)",
        ms(ours),
        ms(ours) / PAIRS as f64,
        ms(create_part) / PAIRS as f64,
        ms(one_lv_report),
        ms(theirs),
        ms(theirs) / PAIRS as f64
    );
    println!("  create+remove ratio (processes / sys::lvm): {pair_ratio:.2}x (target >= 1.3x)");
    println!(
        "  reports x{REPORTS} ({} LVs each): sys::lvm {:.0} ms ({:.2} ms each), lvs processes {:.0} ms ({:.2} ms each)",
        seen.0,
        ms(rep_ours),
        ms(rep_ours) / REPORTS as f64,
        ms(rep_theirs),
        ms(rep_theirs) / REPORTS as f64
    );
    println!("  report ratio (processes / sys::lvm): {rep_ratio:.2}x (target >= 4x)");
    // Where an in-process report's time goes: liblvm2cmd formats every
    // message, debug ones included, before it calls the log function (which
    // keeps only output and errors); a process at the default verbosity
    // formats none of them. Counted with the CLI at full verbosity.
    let debug = run(
        "sh",
        &[
            "-c",
            &format!(
                "lvs -vvvv -a --reportformat json --units b --nosuffix -o {FIELDS} {} 2>&1 >/dev/null | wc -l",
                lab.vg
            ),
        ],
    )?;
    println!(
        "  one report logs {} verbose and debug lines, each formatted in-process for the log callback",
        debug.trim()
    );
    Ok(())
}
