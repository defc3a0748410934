//! Running a command as a test witness or for test set-up.
use std::process::Command;

/// A command that could not run or exited non-zero.
#[derive(Debug, thiserror::Error)]
#[error("`{cmdline}` failed: {why}")]
pub struct CmdError {
    /// The command line.
    pub cmdline: String,
    /// Its exit status and standard error, or why it could not start.
    pub why: String,
}

/// Runs `program args...` and returns its standard output; a failure carries
/// the command line and its standard error.
pub fn run(program: &str, args: &[&str]) -> Result<String, CmdError> {
    let cmdline = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new(program)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .map_err(|e| CmdError {
            cmdline: cmdline.clone(),
            why: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(CmdError {
            cmdline,
            why: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
