//! `pillar-csi`: the one binary of the driver; each role is a subcommand.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "pillar-csi",
    about = "CSI driver for ZFS zvols and LVM logical volumes over NVMe-oF/TCP and iSCSI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version and the commit this binary was built from.
    Version,
}

fn main() {
    match Cli::parse().command {
        Command::Version => println!(
            "pillar-csi {} ({})",
            env!("CARGO_PKG_VERSION"),
            env!("PILLAR_CSI_COMMIT")
        ),
    }
}
