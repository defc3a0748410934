//! Running the two programs the node needs where no library exists
//! (`iscsiadm`, `mkfs.*`), with a bound on how long each may take.
use super::error::{Error, Kind, Result};
use std::{
    io::Read,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// What a finished program printed.
#[derive(Debug)]
pub struct Output {
    /// Its exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `program args...` with no standard input, killing it after
/// `limit`; a program that cannot start, or runs out of time, is an error
/// naming the command line. A non-zero exit is returned, not an error.
pub fn run(program: &str, args: &[&str], limit: Duration) -> Result<Output> {
    let line = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("starting `{line}`"), e))?;
    // Read both pipes on threads so a chatty program cannot block on a
    // full pipe while we wait for it.
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::new(
                    Kind::Timeout,
                    format!("`{line}` did not finish within {limit:?} and was killed"),
                ));
            }
            Err(e) => return Err(Error::io(format!("waiting for `{line}`"), e)),
        }
    };
    Ok(Output {
        code: status.code(),
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    })
}

/// As [`run`], with a non-zero exit an INTERNAL error carrying standard
/// error.
pub fn run_ok(program: &str, args: &[&str], limit: Duration) -> Result<Output> {
    let out = run(program, args, limit)?;
    if out.code != Some(0) {
        return Err(Error::internal(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.code
                .map_or("killed by a signal".into(), |c| format!("exit {c}")),
            without_usage(&out.stderr)
        )));
    }
    Ok(out)
}

/// `stderr` up to a usage text the program printed after its complaint
/// (mkfs.xfs follows "Filesystem must be larger than 300MB." with its
/// whole usage): the complaint is what the caller needs.
fn without_usage(stderr: &str) -> &str {
    let end = stderr
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|&i| {
            stderr[i..]
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("usage:")
        })
        .unwrap_or(stderr.len());
    stderr[..end].trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_text_after_the_complaint_is_left_out() {
        let e = run_ok(
            "sh",
            &[
                "-c",
                "printf 'Filesystem must be larger than 300MB.\\nUsage: mkfs.xfs\\n/* blocksize */ [-b size=num]\\n' >&2; exit 1",
            ],
            Duration::from_secs(10),
        )
        .expect_err("fails");
        assert!(
            e.message
                .ends_with("(exit 1): Filesystem must be larger than 300MB."),
            "{e}"
        );
        assert_eq!(
            without_usage("usage: x"),
            "usage: x",
            "nothing but usage: kept"
        );
        assert_eq!(without_usage("bad\nmore\n"), "bad\nmore");
    }

    #[test]
    fn output_exit_codes_and_time_limits() {
        let out = run(
            "sh",
            &["-c", "echo hi; echo no >&2; exit 3"],
            Duration::from_secs(10),
        )
        .expect("runs");
        assert_eq!(
            (out.code, out.stdout.trim(), out.stderr.trim()),
            (Some(3), "hi", "no")
        );
        let e = run_ok(
            "sh",
            &["-c", "echo bad >&2; exit 1"],
            Duration::from_secs(10),
        )
        .expect_err("fails");
        assert!(
            e.message.contains("bad") && e.message.contains("exit 1"),
            "{e}"
        );
        let start = Instant::now();
        let e = run("sleep", &["30"], Duration::from_millis(200)).expect_err("killed");
        assert_eq!(e.kind, Kind::Timeout);
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
