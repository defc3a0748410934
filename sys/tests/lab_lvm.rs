//! `sys::lvm` against real LVM in the kernel lab (`tests/lab/run tests -- lvm_`):
//! the lab's VG and thin pool, with the `lvs`/`vgs` CLI as the independent
//! witness (tests only; the library runs no process).
use pillar_csi_lab::{run, Lab, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use sys::lvm::{classify, Adoptable, Created, Error, Lv, LvName, Lvm, LvmUuid, Refusal, VgName};

const MIB: u64 = 1 << 20;
const FIELDS: &str = "vg_name,lv_name,vg_uuid,lv_uuid,lv_attr,segtype,pool_lv,origin,lv_size,data_percent,metadata_percent,lv_path,lv_layout,lv_role";

/// The lab's VG and thin pool as checked names.
fn names(lab: &Lab) -> Result<(VgName, LvName)> {
    Ok((VgName::new(&lab.vg)?, LvName::new(&lab.thin_pool)?))
}

/// The LV as LVM reports it once nothing holds it open. udev's rules open a
/// new LV to probe it, so right after a create its `open` flag can still be
/// set for a moment; an LV that stays open for 10 s is reported as it is.
fn idle_lv(lvm: &Lvm, vg: &VgName, lv: &LvName) -> Result<Lv> {
    let _ = run("udevadm", &["settle"]);
    for _ in 0..50 {
        let found = lvm.lv(vg, lv)?;
        if found.attr.open == Some(false) {
            return Ok(found);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(lvm.lv(vg, lv)?)
}

/// `lvs -a` of a VG through the CLI, as JSON objects keyed by LV name.
fn cli_lvs(vg: &str) -> Result<BTreeMap<String, Value>> {
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
            vg,
        ],
    )?;
    let doc: Value = serde_json::from_str(&out)?;
    let mut lvs = BTreeMap::new();
    for lv in doc["report"][0]["lv"].as_array().ok_or("no lv array")? {
        let name = lv["lv_name"].as_str().ok_or("no lv_name")?;
        lvs.insert(
            name.trim_matches(|c| c == '[' || c == ']').to_owned(),
            lv.clone(),
        );
    }
    Ok(lvs)
}

/// The CLI's view of a VG: `vgs` and `lvs -a` output, for before/after comparisons.
fn cli_state(vg: &str) -> Result<String> {
    let vgs = run(
        "vgs",
        &[
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "vg_name,vg_uuid,vg_size,vg_free,lv_count",
            vg,
        ],
    )?;
    let lvs = run(
        "lvs",
        &[
            "-a",
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "lv_name,lv_uuid,lv_attr,lv_size,segtype,pool_lv,origin",
            vg,
        ],
    )?;
    Ok(format!("{vgs}\n{lvs}"))
}

fn field<'a>(lv: &'a Value, name: &str) -> &'a str {
    lv[name].as_str().unwrap_or_default()
}

/// Checks an `Lv` from the library against the CLI's report of it.
fn assert_matches_cli(lv: &Lv) -> Result<()> {
    let cli = cli_lvs(lv.vg.as_str())?;
    let c = cli
        .get(&lv.name)
        .ok_or(format!("lvs does not show {}", lv.name))?;
    assert_eq!(lv.uuid.as_str(), field(c, "lv_uuid"), "{}: uuid", lv.name);
    assert_eq!(
        lv.vg_uuid.as_str(),
        field(c, "vg_uuid"),
        "{}: vg_uuid",
        lv.name
    );
    assert_eq!(
        lv.size.to_string(),
        field(c, "lv_size"),
        "{}: size",
        lv.name
    );
    assert_eq!(lv.attr.raw, field(c, "lv_attr"), "{}: attr", lv.name);
    assert_eq!(lv.segtype, field(c, "segtype"), "{}: segtype", lv.name);
    assert_eq!(
        lv.pool_lv.clone().unwrap_or_default(),
        field(c, "pool_lv").trim_matches(|c| c == '[' || c == ']'),
        "{}: pool",
        lv.name
    );
    assert_eq!(
        lv.origin.clone().unwrap_or_default(),
        field(c, "origin").trim_matches(|c| c == '[' || c == ']'),
        "{}: origin",
        lv.name
    );
    assert_eq!(
        lv.path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        field(c, "lv_path"),
        "{}: path",
        lv.name
    );
    Ok(())
}

/// What a create returned (read from the kernel's device-mapper entry) is
/// what LVM reports of the LV.
fn assert_created_is(created: &Created, lv: &Lv) {
    assert!(created.active);
    assert_eq!(created.name.as_str(), lv.name);
    assert_eq!(created.vg, lv.vg);
    assert_eq!(created.uuid, lv.uuid);
    assert_eq!(created.vg_uuid, lv.vg_uuid);
    assert_eq!(created.size, lv.size);
    assert_eq!(Some(&created.path), lv.path.as_ref());
    assert!(created.path.exists(), "{}", created.path.display());
}

#[test]
#[ignore = "needs the kernel lab"]
fn lvm_create_linear_and_thin_cross_checked_with_lvs() -> Result<()> {
    let lab = Lab::get();
    let (vg, pool) = names(&lab)?;
    let lvm = Lvm::start()?;
    let lin = LvName::new(&lab.unique("lvm-lin"))?;
    let thin = LvName::new(&lab.unique("lvm-thin"))?;

    let created = lvm.create_linear(&vg, &lin, 8 * MIB)?;
    let l = idle_lv(&lvm, &vg, &lin)?;
    assert_created_is(&created, &l);
    assert_eq!(
        (l.name.as_str(), l.size, l.segtype.as_str()),
        (lin.as_str(), 8 * MIB, "linear")
    );
    assert!(l.attr.active && l.attr.open == Some(false), "{:?}", l.attr);
    assert!(
        l.path.as_ref().is_some_and(|p| p.exists()),
        "device node {:?}",
        l.path
    );
    assert_matches_cli(&l)?;
    assert_eq!(classify(&l, None), Ok(Adoptable::Linear));
    assert_eq!(classify(&l, Some(&pool)), Err(Refusal::LinearWithThinPool));

    // Not a multiple of the extent size: rounded up to whole extents.
    let created = lvm.create_thin(&vg, &pool, &thin, 16 * MIB + 512)?;
    let t = idle_lv(&lvm, &vg, &thin)?;
    assert_created_is(&created, &t);
    let extent = lvm.vg(&vg)?.extent_size;
    assert_eq!(t.size, (16 * MIB + 512).div_ceil(extent) * extent);
    assert_eq!(t.segtype, "thin");
    assert_eq!(t.pool_lv.as_deref(), Some(pool.as_str()));
    assert_eq!(t.data_percent, Some(0.0));
    assert_matches_cli(&t)?;
    assert_eq!(classify(&t, Some(&pool)), Ok(Adoptable::Thin));
    assert_eq!(classify(&t, None), Err(Refusal::ThinWithoutPool));

    // Reading back one LV and the whole VG gives the same values.
    assert_eq!(lvm.lv(&vg, &thin)?, t);
    let all = lvm.lvs(&vg)?;
    let cli = cli_lvs(&lab.vg)?;
    let mine: Vec<(String, String)> = all
        .iter()
        .map(|l| (l.name.clone(), l.uuid.to_string()))
        .collect();
    let theirs: Vec<(String, String)> = cli
        .iter()
        .map(|(n, v)| (n.clone(), field(v, "lv_uuid").to_owned()))
        .collect();
    let mut mine_sorted = mine.clone();
    mine_sorted.sort();
    assert_eq!(
        mine_sorted, theirs,
        "lvs lists the same LVs (hidden ones included)"
    );
    for lv in &all {
        assert_matches_cli(lv)?;
    }

    lvm.remove(&vg, &thin, &t.uuid)?;
    lvm.remove(&vg, &lin, &l.uuid)?;
    let cli = cli_lvs(&lab.vg)?;
    assert!(
        !cli.contains_key(lin.as_str()) && !cli.contains_key(thin.as_str()),
        "both removed: {:?}",
        cli.keys()
    );
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn lvm_vg_and_thin_pool_capacity_match_the_cli() -> Result<()> {
    let lab = Lab::get();
    let (vg, pool) = names(&lab)?;
    let lvm = Lvm::start()?;
    let thin = LvName::new(&lab.unique("lvm-cap"))?;
    let t = lvm.create_thin(&vg, &pool, &thin, 32 * MIB)?;
    let dev = t.path.clone();
    // Write 4 MiB so the pool's data use is not zero.
    run(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", dev.display()),
            "bs=1M",
            "count=4",
            "oflag=direct",
            "status=none",
        ],
    )?;

    let v = lvm.vg(&vg)?;
    let out = run(
        "vgs",
        &[
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size",
            &lab.vg,
        ],
    )?;
    let doc: Value = serde_json::from_str(&out)?;
    let c = &doc["report"][0]["vg"][0];
    assert_eq!(
        (
            v.name.as_str(),
            v.uuid.as_str(),
            v.size.to_string(),
            v.free.to_string(),
            v.extent_size.to_string()
        ),
        (
            field(c, "vg_name"),
            field(c, "vg_uuid"),
            field(c, "vg_size").to_owned(),
            field(c, "vg_free").to_owned(),
            field(c, "vg_extent_size").to_owned()
        )
    );
    assert!(v.free < v.size && v.size > 0);

    // The pool's use moves while other thin volumes settle, so our reading
    // and the CLI's are compared only when the CLI's read lies between two
    // equal readings of ours (the pool did not change meanwhile).
    let mut compared = None;
    for _ in 0..20 {
        let before = lvm.thin_pool(&vg, &pool)?;
        let cli = cli_lvs(&lab.vg)?;
        let after = lvm.thin_pool(&vg, &pool)?;
        let use_of = |p: &sys::lvm::ThinPool| (p.data_percent, p.metadata_percent);
        if use_of(&before) == use_of(&after) {
            compared = Some((after, cli[pool.as_str()].clone()));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (p, c) = compared.ok_or("the thin pool's use never held still for one CLI read")?;
    assert_eq!(p.size.to_string(), field(&c, "lv_size"));
    assert_eq!(p.data_percent, field(&c, "data_percent").parse::<f64>()?);
    assert_eq!(
        p.metadata_percent,
        field(&c, "metadata_percent").parse::<f64>()?
    );
    assert!(p.data_percent > 0.0 && p.used >= 4 * MIB / 2, "{p:?}");
    assert_matches_cli(&p.lv)?;

    // A linear LV is not a thin pool.
    let lin = LvName::new(&lab.unique("lvm-notpool"))?;
    let l = lvm.create_linear(&vg, &lin, 4 * MIB)?;
    match lvm.thin_pool(&vg, &lin) {
        Err(Error::NotAThinPool { pool, .. }) => assert_eq!(pool, lin.as_str()),
        other => panic!("expected NotAThinPool, got {other:?}"),
    }
    lvm.remove(&vg, &lin, &l.uuid)?;
    lvm.remove(&vg, &thin, &t.uuid)?;
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn lvm_extend_grows_and_never_shrinks() -> Result<()> {
    let lab = Lab::get();
    let (vg, pool) = names(&lab)?;
    let lvm = Lvm::start()?;
    for thin in [false, true] {
        let name = LvName::new(&lab.unique("lvm-grow"))?;
        let lv = if thin {
            lvm.create_thin(&vg, &pool, &name, 8 * MIB)?
        } else {
            lvm.create_linear(&vg, &name, 8 * MIB)?
        };
        let grown = lvm.extend(&vg, &name, 12 * MIB)?;
        assert_eq!((grown.size, &grown.uuid), (12 * MIB, &lv.uuid));
        assert_matches_cli(&grown)?;
        // The same size again changes nothing.
        assert_eq!(lvm.extend(&vg, &name, 12 * MIB)?.size, 12 * MIB);
        let before = cli_state(&lab.vg)?;
        match lvm.extend(&vg, &name, 8 * MIB) {
            Err(Error::Shrink {
                current,
                requested,
                lv,
                ..
            }) => {
                assert_eq!(
                    (current, requested, lv.as_str()),
                    (12 * MIB, 8 * MIB, name.as_str())
                )
            }
            other => panic!("expected Shrink, got {other:?}"),
        }
        assert_eq!(
            cli_state(&lab.vg)?,
            before,
            "a refused shrink changes nothing"
        );
        assert_eq!(
            cli_lvs(&lab.vg)?[name.as_str()]["lv_size"],
            (12 * MIB).to_string()
        );
        lvm.remove(&vg, &name, &lv.uuid)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn lvm_remove_only_when_the_uuid_is_still_the_expected_one() -> Result<()> {
    let lab = Lab::get();
    let (vg, _) = names(&lab)?;
    let lvm = Lvm::start()?;
    let name = LvName::new(&lab.unique("lvm-pin"))?;
    let first = lvm.create_linear(&vg, &name, 4 * MIB)?;
    // Re-created under the same name (out of band, by the CLI): a new UUID.
    run("lvremove", &["-y", &format!("{}/{name}", lab.vg)])?;
    run(
        "lvcreate",
        &["-y", "-n", name.as_str(), "-L", "4m", &lab.vg],
    )?;
    let second = lvm.lv(&vg, &name)?;
    assert_ne!(first.uuid, second.uuid);

    let before = cli_state(&lab.vg)?;
    match lvm.remove(&vg, &name, &first.uuid) {
        Err(Error::UuidMismatch {
            expected,
            found,
            lv,
            ..
        }) => {
            assert_eq!(
                (expected, found, lv.as_str()),
                (first.uuid.clone(), second.uuid.clone(), name.as_str())
            )
        }
        other => panic!("expected UuidMismatch, got {other:?}"),
    }
    assert_eq!(
        cli_state(&lab.vg)?,
        before,
        "a UUID mismatch changes nothing"
    );
    assert!(cli_lvs(&lab.vg)?.contains_key(name.as_str()));

    lvm.remove(&vg, &name, &second.uuid)?;
    assert!(!cli_lvs(&lab.vg)?.contains_key(name.as_str()), "removed");
    match lvm.remove(&vg, &name, &second.uuid) {
        Err(Error::LvNotFound { vg: v, lv }) => {
            assert_eq!((v.as_str(), lv.as_str()), (vg.as_str(), name.as_str()))
        }
        other => panic!("expected LvNotFound, got {other:?}"),
    }
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn lvm_bad_input_gets_typed_errors_and_changes_nothing() -> Result<()> {
    let lab = Lab::get();
    let (vg, pool) = names(&lab)?;
    let lvm = Lvm::start()?;
    let keep = LvName::new(&lab.unique("lvm-keep"))?;
    let kept = lvm.create_linear(&vg, &keep, 4 * MIB)?;
    let before = cli_state(&lab.vg)?;
    let vgs_before = run("vgs", &["--noheadings", "-o", "vg_name"])?;

    // Invalid names never reach LVM: they cannot be typed.
    for bad in [
        "-y",
        "--select",
        "a b",
        "a;rm",
        "x/y",
        "",
        ".",
        "snapshot1",
        "p_tmeta",
        "lv#1",
    ] {
        let err = LvName::new(bad).expect_err(bad);
        assert_eq!(err.value, bad);
        println!("rejected {bad:?}: {err}");
    }
    assert!(VgName::new("-labvg").is_err() && VgName::new(&"v".repeat(128)).is_err());
    assert!(LvmUuid::new("--force").is_err());

    // Missing VG.
    let missing = VgName::new(&lab.unique("nosuchvg"))?;
    let lv = LvName::new("x")?;
    match lvm.create_linear(&missing, &lv, 4 * MIB) {
        Err(Error::VgNotFound { vg }) => assert_eq!(vg, missing.as_str()),
        other => panic!("expected VgNotFound, got {other:?}"),
    }
    match lvm.vg(&missing) {
        Err(e @ Error::VgNotFound { .. }) => {
            assert!(e.to_string().contains(missing.as_str()), "{e}")
        }
        other => panic!("expected VgNotFound, got {other:?}"),
    }
    assert!(matches!(lvm.lvs(&missing), Err(Error::VgNotFound { .. })));
    assert!(matches!(
        lvm.create_thin(&missing, &pool, &lv, 4 * MIB),
        Err(Error::VgNotFound { .. })
    ));

    // The LV exists (linear and thin): left as it is.
    for res in [
        lvm.create_linear(&vg, &keep, 8 * MIB),
        lvm.create_thin(&vg, &pool, &keep, 8 * MIB),
    ] {
        match res {
            Err(e @ Error::LvExists { .. }) => {
                assert!(e.to_string().contains(keep.as_str()), "{e}")
            }
            other => panic!("expected LvExists, got {other:?}"),
        }
    }
    assert_eq!(lvm.lv(&vg, &keep)?.uuid, kept.uuid);

    // Larger than the VG's free space.
    let free = lvm.vg(&vg)?.free;
    let big = LvName::new(&lab.unique("lvm-big"))?;
    match lvm.create_linear(&vg, &big, free + 64 * MIB) {
        Err(e @ Error::InsufficientSpace { .. }) => {
            let Error::InsufficientSpace {
                requested,
                free: f,
                lv,
                ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(
                (*requested, *f, lv.as_str()),
                (free + 64 * MIB, free, big.as_str())
            );
            println!("refused: {e}");
        }
        other => panic!("expected InsufficientSpace, got {other:?}"),
    }
    match lvm.extend(&vg, &keep, free + 64 * MIB) {
        Err(Error::InsufficientSpace { lv, .. }) => assert_eq!(lv, keep.as_str()),
        other => panic!("expected InsufficientSpace on extend, got {other:?}"),
    }

    // A thin LV in something that is not a thin pool.
    for not_pool in [keep.clone(), LvName::new(&lab.unique("nosuchpool"))?] {
        match lvm.create_thin(&vg, &not_pool, &big, 4 * MIB) {
            Err(e @ Error::NotAThinPool { .. }) => println!("refused: {e}"),
            other => panic!("expected NotAThinPool, got {other:?}"),
        }
    }

    // Sizes that are not whole sectors.
    assert!(matches!(
        lvm.create_linear(&vg, &big, 0),
        Err(Error::InvalidSize { .. })
    ));
    assert!(matches!(
        lvm.create_linear(&vg, &big, 1000),
        Err(Error::InvalidSize { .. })
    ));

    // UUID mismatch (another real UUID: the VG's).
    let other = LvmUuid::new(kept.vg_uuid.as_str())?;
    assert!(matches!(
        lvm.remove(&vg, &keep, &other),
        Err(Error::UuidMismatch { .. })
    ));
    // Missing LV.
    assert!(matches!(
        lvm.remove(&vg, &big, &kept.uuid),
        Err(Error::LvNotFound { .. })
    ));
    assert!(matches!(
        lvm.extend(&vg, &big, 8 * MIB),
        Err(Error::LvNotFound { .. })
    ));

    assert_eq!(cli_state(&lab.vg)?, before, "no bad request changed the VG");
    assert_eq!(
        run("vgs", &["--noheadings", "-o", "vg_name"])?,
        vgs_before,
        "no VG appeared"
    );
    lvm.remove(&vg, &keep, &kept.uuid)?;
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn lvm_eight_threads_issue_mixed_requests_at_once() -> Result<()> {
    let lab = Lab::get();
    let (vg, pool) = names(&lab)?;
    let lvm = Lvm::start()?;
    let lvm = &lvm;
    let vg = &vg;
    let pool = &pool;
    let results: Vec<std::result::Result<Vec<(String, String)>, String>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let name = lab.unique(&format!("lvm-t{i}"));
                    s.spawn(
                        move || -> std::result::Result<Vec<(String, String)>, String> {
                            let e = |e: Error| e.to_string();
                            let mut made = Vec::new();
                            for round in 0..3 {
                                let n = LvName::new(&format!("{name}-{round}"))
                                    .map_err(|e| e.to_string())?;
                                let lv = if (i + round) % 2 == 0 {
                                    lvm.create_linear(vg, &n, 4 * MIB).map_err(e)?
                                } else {
                                    lvm.create_thin(vg, pool, &n, 8 * MIB).map_err(e)?
                                };
                                if lv.name != n {
                                    return Err(format!("asked for {n}, got {}", lv.name));
                                }
                                let again = lvm.lv(vg, &n).map_err(e)?;
                                if again.uuid != lv.uuid {
                                    return Err(format!("{n}: uuid changed"));
                                }
                                let v = lvm.vg(vg).map_err(e)?;
                                if v.name != *vg {
                                    return Err(format!("asked for VG {vg}, got {}", v.name));
                                }
                                let all = lvm.lvs(vg).map_err(e)?;
                                if !all.iter().any(|l| l.uuid == lv.uuid) {
                                    return Err(format!("{n} missing from lvs"));
                                }
                                let grown = lvm.extend(vg, &n, lv.size + 4 * MIB).map_err(e)?;
                                if grown.size != lv.size + 4 * MIB || grown.uuid != lv.uuid {
                                    return Err(format!("{n}: extend gave {grown:?}"));
                                }
                                made.push((n.to_string(), lv.uuid.to_string()));
                                if round < 2 {
                                    lvm.remove(vg, &n, &lv.uuid).map_err(e)?;
                                }
                            }
                            Ok(made)
                        },
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                .collect()
        });
    let cli = cli_lvs(&lab.vg)?;
    let mut kept = 0;
    for (i, r) in results.into_iter().enumerate() {
        let made = r.map_err(|e| format!("thread {i}: {e}"))?;
        assert_eq!(made.len(), 3);
        for (round, (name, uuid)) in made.iter().enumerate() {
            if round < 2 {
                assert!(!cli.contains_key(name), "{name} was removed");
            } else {
                assert_eq!(field(&cli[name], "lv_uuid"), uuid, "{name}");
                let lv = lvm.lv(vg, &LvName::new(name)?)?;
                assert_matches_cli(&lv)?;
                lvm.remove(vg, &LvName::new(name)?, &lv.uuid)?;
                kept += 1;
            }
        }
    }
    assert_eq!(kept, 8);
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn lvm_one_service_per_process_and_it_restarts() -> Result<()> {
    let lab = Lab::get();
    let (vg, _) = names(&lab)?;
    let lvm = Lvm::start()?;
    assert!(matches!(Lvm::start(), Err(Error::AlreadyRunning)));
    let size = lvm.vg(&vg)?.size;
    drop(lvm);
    // The handle was released (lvm2_exit); a new service initialises again.
    let lvm = Lvm::start()?;
    assert_eq!(lvm.vg(&vg)?.size, size);
    Ok(())
}

/// One layout to build with the CLI and the classification the spec wants.
struct Layout {
    setup: Vec<Vec<String>>,
    modules: &'static [&'static str],
    expect: Vec<(
        &'static str,
        Option<&'static str>,
        std::result::Result<Adoptable, &'static str>,
    )>,
}

fn cmd(s: &str, vg: &str) -> Vec<String> {
    s.replace("VG", vg)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Builds every layout the spec names in a VG of its own (two PVs, for
/// mirrors and RAID), classifies each LV through the library and writes the
/// CLI's JSON report to `lvm-layouts.json` in the work folder (the samples
/// the unit tests read).
#[test]
#[ignore = "needs the kernel lab"]
fn lvm_layouts_are_classified_as_the_spec_says() -> Result<()> {
    let lab = Lab::get();
    let vgname = lab.unique("lvmlay").replace('-', "");
    let mut loops = Vec::new();
    for i in 0..2 {
        let img = lab.work.join(format!("{vgname}-{i}.img"));
        run("truncate", &["-s", "160M", &img.display().to_string()])?;
        loops.push(
            run("losetup", &["-f", "--show", &img.display().to_string()])?
                .trim()
                .to_owned(),
        );
    }
    let mut args = vec!["-y", &vgname];
    args.extend(loops.iter().map(String::as_str));
    run("vgcreate", &args)?;
    let layouts = vec![
        Layout {
            setup: vec![cmd("lvcreate -y -n lin -L 8m VG", &vgname)],
            modules: &[],
            expect: vec![
                ("lin", None, Ok(Adoptable::Linear)),
                ("lin", Some("pool"), Err("LinearWithThinPool")),
            ],
        },
        Layout {
            setup: vec![cmd("lvcreate -y -n striped -i 2 -L 8m VG", &vgname)],
            modules: &[],
            expect: vec![("striped", None, Err("NotLinear"))],
        },
        Layout {
            setup: vec![
                cmd("lvcreate -y -n origin -L 8m VG", &vgname),
                cmd("lvcreate -y -s -n snap -L 4m VG/origin", &vgname),
            ],
            modules: &["dm-snapshot"],
            expect: vec![
                ("origin", None, Err("SnapshotOrigin")),
                ("snap", None, Err("Snapshot")),
            ],
        },
        Layout {
            setup: vec![
                cmd("lvcreate -y -n pool -L 16m -T VG/pool", &vgname),
                cmd("lvcreate -y -n thin -V 8m -T VG/pool", &vgname),
                cmd("lvcreate -y -s -n tsnap VG/thin", &vgname),
                cmd("lvcreate -y -n pool2 -L 8m -T VG/pool2", &vgname),
                cmd("lvcreate -y -n thin2 -V 8m -T VG/pool2", &vgname),
            ],
            modules: &["dm-thin-pool"],
            expect: vec![
                ("pool", Some("pool"), Err("ThinPool")),
                ("pool_tdata", Some("pool"), Err("ThinPoolData")),
                ("pool_tmeta", Some("pool"), Err("Metadata")),
                ("thin", Some("pool"), Ok(Adoptable::Thin)),
                ("thin", None, Err("ThinWithoutPool")),
                ("thin2", Some("pool"), Err("OtherThinPool")),
                ("tsnap", Some("pool"), Err("ThinSnapshot")),
            ],
        },
        Layout {
            setup: vec![cmd(
                "lvcreate -y --type mirror -m 1 --mirrorlog core -n mirror -L 4m VG",
                &vgname,
            )],
            modules: &["dm-mirror", "dm-log"],
            expect: vec![
                ("mirror", None, Err("Mirror")),
                ("mirror_mimage_0", None, Err("Mirror")),
            ],
        },
        Layout {
            setup: vec![cmd(
                "lvcreate -y --type raid1 -m 1 -n raid -L 4m VG",
                &vgname,
            )],
            modules: &["dm-raid"],
            expect: vec![
                ("raid", None, Err("Raid")),
                ("raid_rimage_0", None, Err("Raid")),
                ("raid_rmeta_0", None, Err("Metadata")),
            ],
        },
        Layout {
            setup: vec![cmd(
                "lvcreate -y --type snapshot -n sparse -V 16m -L 4m VG",
                &vgname,
            )],
            modules: &["dm-snapshot", "dm-zero"],
            expect: vec![
                ("sparse", None, Err("Snapshot")),
                ("sparse_vorigin", None, Err("Virtual")),
            ],
        },
        Layout {
            setup: vec![
                cmd("lvcreate -y --type cache-pool -n cpool -L 8m VG", &vgname),
                cmd("lvcreate -y -n cached -L 8m VG", &vgname),
                cmd(
                    "lvconvert -y --type cache --cachepool VG/cpool VG/cached",
                    &vgname,
                ),
            ],
            modules: &["dm-cache", "dm-cache-smq"],
            expect: vec![
                ("cached", None, Err("Cache")),
                ("cached_corig", None, Err("Cache")),
                ("cpool_cpool", None, Err("Cache")),
                ("cpool_cpool_cdata", None, Err("Cache")),
            ],
        },
        // Last, and with activation skip set, so that udev autoactivation
        // after the other layouts' changes does not bring it back.
        Layout {
            setup: vec![
                cmd("lvcreate -y -n inactive -L 4m VG", &vgname),
                cmd("lvchange -ky VG/inactive", &vgname),
                cmd("lvchange -an VG/inactive", &vgname),
            ],
            modules: &[],
            expect: vec![("inactive", None, Err("NotActive"))],
        },
    ];
    let mut built = Vec::new();
    for layout in &layouts {
        for m in layout.modules {
            let _ = run("modprobe", &[m]);
        }
        let mut ok = true;
        for step in &layout.setup {
            let argv: Vec<&str> = step.iter().map(String::as_str).collect();
            if let Err(e) = run(argv[0], &argv[1..]) {
                println!("layout skipped, the lab kernel or tools cannot build it: {e}");
                ok = false;
                break;
            }
        }
        if ok {
            built.push(layout);
        }
    }
    let sample = run(
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
            &vgname,
        ],
    )?;
    std::fs::write(lab.work.join("lvm-layouts.json"), &sample)?;
    let vgs = run(
        "vgs",
        &[
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size",
            &vgname,
            &lab.vg,
        ],
    )?;
    std::fs::write(lab.work.join("lvm-vgs.json"), &vgs)?;

    let lvm = Lvm::start()?;
    let vg = VgName::new(&vgname)?;
    let lvs = lvm.lvs(&vg)?;
    let pool = LvName::new("pool")?;
    for lv in &lvs {
        println!(
            "{:<22} attr {} seg {:<10} layout {:<20} role {:<32} -> none: {:?}; pool: {:?}",
            lv.name,
            lv.attr.raw,
            lv.segtype,
            lv.layout.join(","),
            lv.role.join(","),
            classify(lv, None),
            classify(lv, Some(&pool))
        );
        assert_matches_cli(lv)?;
    }
    let name_of = |r: &Refusal| {
        format!("{r:?}")
            .split([' ', '{', '('])
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let mut checked = 0;
    for layout in &built {
        for (lv_name, backend_pool, want) in &layout.expect {
            let lv = lvs
                .iter()
                .find(|l| l.name == *lv_name)
                .ok_or(format!("{lv_name} not reported"))?;
            let backend = backend_pool.map(LvName::new).transpose()?;
            let got = classify(lv, backend.as_ref());
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{lv_name}"),
                (Err(w), Err(g)) => assert_eq!(*w, name_of(g), "{lv_name}: {g}"),
                _ => panic!("{lv_name} with pool {backend_pool:?}: expected {want:?}, got {got:?}"),
            }
            checked += 1;
        }
    }
    // Whatever was built, only `lin` (no pool) and `thin` (pool) are adoptable.
    for lv in &lvs {
        for backend in [None, Some(&pool)] {
            if let Ok(kind) = classify(lv, backend) {
                assert!(
                    (lv.name == "lin" && backend.is_none() && kind == Adoptable::Linear)
                        || (lv.name == "thin" && backend.is_some() && kind == Adoptable::Thin),
                    "{} must not be adoptable with pool {backend:?}",
                    lv.name
                );
            }
        }
    }
    println!(
        "layouts built: {} of {}; classifications checked: {checked}",
        built.len(),
        layouts.len()
    );
    drop(lvm);
    let _ = run("vgremove", &["-y", "-f", &vgname]);
    for l in &loops {
        let _ = run("losetup", &["-d", l]);
    }
    Ok(())
}
