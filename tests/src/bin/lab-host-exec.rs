//! The lab's control-plane programs run on the host ([`pillar_csi_lab::host_exec`]).
//!
//!     lab-host-exec serve FOLDER   (on the host, by tests/lab/run)
//!     lab-host-exec links FOLDER   (in the guest, by tests/lab/guest)
//!
//! binds the host's 127.0.0.1 on a free port, writes the port to
//! FOLDER/host-exec.port and a new token to FOLDER/host-exec.token (read
//! by root only), and serves until killed. `links` makes FOLDER's links,
//! one per program below, to this binary. Run as `kubectl`, `helm`,
//! `kube-controller-manager`, `kube-scheduler` or `snapshot-controller`
//! (a link of that name in the guest's `PILLAR_LAB_HOST_TOOLS` folder), it
//! runs that program on the host and exits as it did.
use pillar_csi_lab::host_exec::{forward, serve, PROGRAMS, TOOLS_VAR};
use std::{io::Read, os::unix::fs::PermissionsExt, path::Path, process::ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let name = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lab-host-exec: {e}");
            return ExitCode::from(125);
        }
    };
    if PROGRAMS.contains(&name.as_str()) {
        let own_dir = std::env::var_os(TOOLS_VAR).unwrap_or_default();
        return match runtime.block_on(forward(&name, Path::new(&own_dir), args[1..].to_vec())) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(255)),
            Err(e) => {
                eprintln!("lab-host-exec ({name}): {e}");
                ExitCode::from(125)
            }
        };
    }
    match args.get(1..).unwrap_or_default() {
        [serve_word, folder] if serve_word == "serve" => {
            match runtime.block_on(start_serving(Path::new(folder))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("lab-host-exec: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        [links_word, folder] if links_word == "links" => match links(Path::new(folder)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lab-host-exec: links in {folder}: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: lab-host-exec serve FOLDER | links FOLDER, or run as one of: {}",
                PROGRAMS.join(", ")
            );
            ExitCode::from(2)
        }
    }
}

/// Binds, writes the token and the port, and serves.
async fn start_serving(folder: &Path) -> pillar_csi_lab::Result<()> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let token_file = folder.join("host-exec.token");
    std::fs::write(&token_file, &token)?;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    // Written last and whole: the runner waits for this file.
    let tmp = folder.join("host-exec.port.new");
    std::fs::write(&tmp, format!("{port}\n"))?;
    std::fs::rename(&tmp, folder.join("host-exec.port"))?;
    serve(listener, token).await
}

/// A link in `folder` to this binary for each program run on the host.
fn links(folder: &Path) -> std::io::Result<()> {
    let me = std::env::current_exe()?;
    std::fs::create_dir_all(folder)?;
    for program in PROGRAMS {
        let link = folder.join(program);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&me, &link)?;
    }
    Ok(())
}
