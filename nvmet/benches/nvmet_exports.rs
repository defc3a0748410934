//! Benchmark in the kernel lab: 500 NVMe exports applied and read back through
//! this crate, against the same objects written by per-object shell commands
//! (mkdir / echo / ln, as a hand-written script or nvmetcli's users do).
//!
//! Run with `make bench FILTER=nvmet`. Absolute times under TCG mean little;
//! the ratios and the per-export cost of each half (linearity) are the result.
use nvmet::{Namespace, Nqn, Nsid, Nvmet, Port, PortId, State, Subsystem, Teardown};
use pillar_csi_lab::{block::wait_for, run, Lab, Result};
use std::{
    fmt::Write as _,
    process::Command,
    time::{Duration, Instant},
};

const EXPORTS: usize = 500;
const PORT: PortId = PortId(30);

fn nqn(i: usize) -> Result<Nqn> {
    Ok(Nqn::new(&format!(
        "nqn.2026-01.com.bhyoo.pillar-csi.bench:vol{i}"
    ))?)
}

fn one_export(i: usize, device: &str) -> Result<State> {
    let mut sub = Subsystem {
        allow_any_host: true,
        ..Default::default()
    };
    sub.namespaces.insert(
        Nsid::new(1)?,
        Namespace {
            device_path: device.into(),
            enabled: true,
            ..Default::default()
        },
    );
    let mut port = Port::tcp("127.0.0.1:4430".parse()?);
    // Each export adds its link; the other exports' links stay.
    port.subsystems.insert(nqn(i)?);
    let mut state = State::default();
    state.subsystems.insert(nqn(i)?, sub);
    state.ports.insert(PORT, port);
    Ok(state)
}

fn shell_script(device: &str, range: std::ops::Range<usize>) -> Result<String> {
    let mut s = String::from("set -e\ncd /sys/kernel/config/nvmet\n");
    if range.start == 0 {
        writeln!(s, "mkdir ports/{PORT}")?;
        writeln!(
            s,
            "echo tcp > ports/{PORT}/addr_trtype; echo ipv4 > ports/{PORT}/addr_adrfam"
        )?;
        writeln!(
            s,
            "echo 127.0.0.1 > ports/{PORT}/addr_traddr; echo 4430 > ports/{PORT}/addr_trsvcid"
        )?;
    }
    for i in range {
        let n = nqn(i)?;
        writeln!(s, "mkdir subsystems/{n}")?;
        writeln!(s, "echo 1 > subsystems/{n}/attr_allow_any_host")?;
        writeln!(s, "mkdir subsystems/{n}/namespaces/1")?;
        writeln!(
            s,
            "echo -n {device} > subsystems/{n}/namespaces/1/device_path"
        )?;
        writeln!(s, "echo 1 > subsystems/{n}/namespaces/1/enable")?;
        writeln!(
            s,
            "ln -s /sys/kernel/config/nvmet/subsystems/{n} ports/{PORT}/subsystems/{n}"
        )?;
    }
    Ok(s)
}

const SHELL_READ: &str = r#"cd /sys/kernel/config/nvmet
for s in subsystems/*; do
  cat "$s/attr_allow_any_host" "$s/attr_serial" "$s/attr_model" >/dev/null
  for n in "$s"/namespaces/*; do cat "$n/device_path" "$n/device_uuid" "$n/device_nguid" "$n/enable" >/dev/null; done
  ls "$s/allowed_hosts" >/dev/null
done
for p in ports/*; do
  cat "$p/addr_trtype" "$p/addr_traddr" "$p/addr_trsvcid" >/dev/null
  for l in "$p"/subsystems/*; do readlink "$l" >/dev/null; done
done
"#;

/// Runs a script with bash, fed on standard input (500 exports do not fit
/// in an argument).
fn bash(script: &str) -> Result<Duration> {
    use std::io::Write;
    let start = Instant::now();
    let mut child = Command::new("bash")
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("no stdin for bash")?
        .write_all(script.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("shell script failed: {status}").into());
    }
    Ok(start.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !args.is_empty() && !args.iter().any(|a| "nvmet_exports".contains(a.as_str())) {
        return Ok(());
    }
    let lab = Lab::get();
    let ds = format!("{}/{}", lab.pool, lab.unique("bench-nvmet"));
    run("zfs", &["create", "-V", "16M", &ds])?;
    let device = format!("/dev/zvol/{ds}");
    wait_for(device.as_ref(), Duration::from_secs(20))?;
    let target = Nvmet::open()?;
    let half = EXPORTS / 2;

    // Ours: one apply per export, as the agent exports volumes one by one.
    let mut ours_halves = [Duration::ZERO; 2];
    for i in 0..EXPORTS {
        let desired = one_export(i, &device)?;
        let start = Instant::now();
        target.apply(&desired)?;
        ours_halves[i / half] += start.elapsed();
    }
    let start = Instant::now();
    let read = target.read()?;
    let ours_read = start.elapsed();
    if read.subsystems.len() != EXPORTS || read.ports[&PORT].subsystems.len() != EXPORTS {
        return Err(format!(
            "read back {} subsystems, expected {EXPORTS}",
            read.subsystems.len()
        )
        .into());
    }
    let all = Teardown {
        subsystems: (0..EXPORTS).map(nqn).collect::<Result<_>>()?,
        ports: [PORT].into(),
        hosts: Default::default(),
    };
    let start = Instant::now();
    target.teardown(&all)?;
    let ours_teardown = start.elapsed();

    // Half the state read back, for the linearity of reads.
    let mut half_read = Duration::ZERO;
    let mut shell_halves = [Duration::ZERO; 2];
    shell_halves[0] = bash(&shell_script(&device, 0..half)?)?;
    let start = Instant::now();
    target.read()?;
    half_read += start.elapsed();
    shell_halves[1] = bash(&shell_script(&device, half..EXPORTS)?)?;
    let shell_read = bash(SHELL_READ)?;
    let check = target.read()?;
    if check.subsystems.len() != EXPORTS {
        return Err("the shell script did not create every export".into());
    }
    target.teardown(&all)?;
    run("zfs", &["destroy", &ds])?;

    let ours = ours_halves[0] + ours_halves[1];
    let shell = shell_halves[0] + shell_halves[1];
    println!("nvmet_exports: {EXPORTS} NVMe/TCP exports (subsystem, namespace, port link)");
    println!(
        "  apply  ours {:8.1} ms ({:.2} ms/export; first half {:.2}, second half {:.2})",
        ms(ours),
        ms(ours) / EXPORTS as f64,
        ms(ours_halves[0]) / half as f64,
        ms(ours_halves[1]) / half as f64
    );
    println!(
        "  apply  shell {:7.1} ms ({:.2} ms/export; first half {:.2}, second half {:.2})",
        ms(shell),
        ms(shell) / EXPORTS as f64,
        ms(shell_halves[0]) / half as f64,
        ms(shell_halves[1]) / half as f64
    );
    println!(
        "  read   ours {:8.1} ms for {EXPORTS} ({:.1} ms for {half}); shell {:.1} ms",
        ms(ours_read),
        ms(half_read),
        ms(shell_read)
    );
    println!("  teardown ours {:.1} ms", ms(ours_teardown));
    println!(
        "  ratio shell/ours: apply {:.2}x, read {:.2}x; linearity (second half / first half per export): ours {:.2}, shell {:.2}; read 500/250: {:.2}",
        ms(shell) / ms(ours),
        ms(shell_read) / ms(ours_read),
        ms(ours_halves[1]) / ms(ours_halves[0]),
        ms(shell_halves[1]) / ms(shell_halves[0]),
        ms(ours_read) / ms(half_read)
    );
    Ok(())
}
