//! Plan a small configfs tree as plain steps, apply it, read it back, and
//! take it down again: an nvmet host, a subsystem, and the link that admits
//! the host to the subsystem.
//!
//! ```sh
//! sudo modprobe nvmet                # configfs mounted at /sys/kernel/config
//! sudo ./target/debug/examples/configfs_tree
//! ```
//!
//! The `nvmet` crate builds such plans from typed objects; this is the layer
//! under it, for any configfs subsystem.
use configfs::{Component, Step, Tree};

/// The longest NQN the kernel takes.
const NQN_MAX: usize = 223;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Fails clearly when configfs is not mounted or nvmet is not loaded.
    let tree = Tree::open("/sys/kernel/config/nvmet")?;

    // Every caller-supplied name goes through Component: no `/`, no `..`,
    // no whitespace, bounded length. A bad name stops here.
    let host = Component::new("nqn.2026-01.org.example:configfs-demo-host", NQN_MAX)?;
    let subsystem = Component::new("nqn.2026-01.org.example:configfs-demo", NQN_MAX)?;
    let sub = format!("subsystems/{subsystem}");
    let admitted = format!("{sub}/allowed_hosts/{host}");

    // The plan is a plain value: directories first, then attributes, then
    // the link; its order can be unit-tested without a kernel.
    let plan = [
        Step::mkdir(format!("hosts/{host}")),
        Step::mkdir(&sub),
        Step::write(format!("{sub}/attr_allow_any_host"), "0"),
        Step::write(format!("{sub}/attr_model"), "configfs example"),
        Step::symlink(format!("hosts/{host}"), &admitted),
    ];
    tree.run(&plan)?;
    println!("applied {} steps", plan.len());

    // Read back: attributes without their newline, children sorted, links
    // relative to the tree's root.
    println!(
        "attr_model = {:?}",
        tree.read_attr(&format!("{sub}/attr_model"))?
    );
    println!(
        "allowed_hosts = {:?}",
        tree.children(&format!("{sub}/allowed_hosts"))?
    );
    println!("{admitted} -> {}", tree.link_target(&admitted)?.display());

    // Take it down in the reverse order: the link, then the objects. A
    // refused step stops the run with the path and the kernel's errno.
    tree.run(&[
        Step::unlink(&admitted),
        Step::rmdir(&sub),
        Step::rmdir(format!("hosts/{host}")),
    ])?;
    if tree.exists(&sub) || tree.exists(&format!("hosts/{host}")) {
        return Err(format!("{sub} or hosts/{host} is still there").into());
    }
    println!("{sub} and hosts/{host} are gone");
    Ok(())
}
