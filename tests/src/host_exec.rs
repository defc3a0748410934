//! The lab's control-plane programs run on the host, started from the guest.
//!
//! Under TCG one `kubectl get` costs the guest about 2 s of emulated CPU
//! (on the host 0.1 s), and kube-controller-manager, kube-scheduler and the
//! snapshot-controller take emulated CPU from the tests all the time they
//! run. None of them needs the guest's kernel or its sockets: they talk to
//! the API server, which is on the host already. So the lab runner starts
//! [`serve`] on the host, and the guest puts a folder first on its PATH
//! whose [`PROGRAMS`] are links to this module's client ([`forward`]): a
//! test, a guide's shell or a helper that runs `kubectl` (or starts
//! kube-controller-manager) gets the same program, with the same arguments,
//! environment, working folder (the guest sees the host's filesystem at the
//! same paths) and, when its arguments name it ([`reads_stdin`]), standard
//! input, run on the host. Its standard output,
//! standard error and exit status come back as if it had run in the guest;
//! a SIGTERM, SIGINT or SIGHUP the client gets is passed on; a client that
//! dies (SIGKILL) takes the program with it. The guest's kubeconfigs name
//! the API server at the host's 127.0.0.1, which the guest's own loopback
//! forwards to the host (tests/lab/guest), so one file serves both sides.
//!
//! The wire, over TCP (the guest reaches the host's 127.0.0.1 at 10.0.2.2):
//! the client sends one JSON line ([`Request`], with the run's token), then
//! frames of a tag byte, a big-endian `u32` length and that many bytes:
//! [`STDIN`] (an empty one is the end of input) and [`SIGNAL`] (an `i32`).
//! The server answers with [`STDOUT`], [`STDERR`], then one [`EXIT`] (an
//! `i32`: the exit code, or 128 + the signal that ended the program) or one
//! [`REFUSED`] (a message) for a request it does not run.
use crate::Result;
use serde::{Deserialize, Serialize};
use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    process::Command,
    sync::mpsc,
};

/// The programs that run on the host: the guest's links' names.
pub const PROGRAMS: [&str; 5] = [
    "kubectl",
    "helm",
    "kube-controller-manager",
    "kube-scheduler",
    "snapshot-controller",
];

/// Client to server: standard input (empty: its end).
pub const STDIN: u8 = 0;
/// Client to server: a signal for the program (`i32`).
pub const SIGNAL: u8 = 1;
/// Server to client: the program's standard output.
pub const STDOUT: u8 = 2;
/// Server to client: the program's standard error.
pub const STDERR: u8 = 3;
/// Server to client: the program ended (`i32` exit status).
pub const EXIT: u8 = 4;
/// Server to client: the request was not run (a message).
pub const REFUSED: u8 = 5;

/// The environment variable naming the server (`10.0.2.2:PORT`).
pub const ADDRESS_VAR: &str = "PILLAR_LAB_HOST_EXEC";
/// The environment variable naming the file that holds the run's token.
pub const TOKEN_VAR: &str = "PILLAR_LAB_HOST_EXEC_TOKEN";
/// The environment variable naming the guest's folder of links.
pub const TOOLS_VAR: &str = "PILLAR_LAB_HOST_TOOLS";

/// The largest request line the server reads (arguments and environment).
const MAX_REQUEST: u64 = 1 << 20;
/// The largest frame either side sends.
const MAX_FRAME: u32 = 1 << 20;

/// What the guest asks the host to run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// The run's token (tests/lab/run writes it where only root reads it).
    pub token: String,
    /// The program's absolute path, as the guest would have run it.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its working folder.
    pub cwd: PathBuf,
    /// Its environment, less PATH (the host's own is used).
    pub env: Vec<(String, String)>,
}

/// Writes one frame.
async fn write_frame(out: &mut (impl AsyncWrite + Unpin), tag: u8, payload: &[u8]) -> Result<()> {
    let len = u32::try_from(payload.len())?;
    let mut frame = Vec::with_capacity(5 + payload.len());
    frame.push(tag);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(payload);
    out.write_all(&frame).await?;
    out.flush().await?;
    Ok(())
}

/// Reads one frame; `None` at the end of the stream.
async fn read_frame(input: &mut (impl AsyncRead + Unpin)) -> Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match input.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return Err(format!("a frame of {len} bytes (at most {MAX_FRAME})").into());
    }
    let mut payload = vec![0u8; len as usize];
    input.read_exact(&mut payload).await?;
    Ok(Some((head[0], payload)))
}

/// An `i32` frame payload.
fn as_i32(payload: &[u8]) -> Result<i32> {
    Ok(i32::from_be_bytes(payload.try_into().map_err(|_| {
        format!("a {}-byte number (4 expected)", payload.len())
    })?))
}

/// Serves requests on `listener` until the process is killed; each
/// connection's program runs while its client is connected.
pub async fn serve(listener: TcpListener, token: String) -> Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let token = token.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &token).await {
                eprintln!("lab-host-exec: {e}");
            }
        });
    }
}

/// Why `request` is not run, if it is not.
fn refusal(request: &Request, token: &str) -> Option<String> {
    if request.token != token {
        return Some("wrong token".into());
    }
    let name = request.program.file_name().and_then(|n| n.to_str());
    if !name.is_some_and(|n| PROGRAMS.contains(&n)) || !request.program.is_absolute() {
        return Some(format!(
            "{} is not one of the programs run on the host ({})",
            request.program.display(),
            PROGRAMS.join(", ")
        ));
    }
    if !request.program.is_file() {
        return Some(format!("{} is not on the host", request.program.display()));
    }
    if !request.cwd.is_dir() {
        return Some(format!(
            "the working folder {} is not on the host (run from the work folder or the checkout)",
            request.cwd.display()
        ));
    }
    None
}

/// One client: its request run, its frames passed on, the program's
/// output and status sent back.
async fn connection(stream: TcpStream, token: &str) -> Result<()> {
    stream.set_nodelay(true)?;
    let (read_half, mut write_half) = stream.into_split();
    let mut input = BufReader::new(read_half);
    let mut line = String::new();
    (&mut input).take(MAX_REQUEST).read_line(&mut line).await?;
    let request: Request = serde_json::from_str(&line)?;
    if let Some(why) = refusal(&request, token) {
        return write_frame(&mut write_half, REFUSED, why.as_bytes()).await;
    }
    let mut child = match Command::new(&request.program)
        .args(&request.args)
        .current_dir(&request.cwd)
        .env_clear()
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let why = format!("starting {}: {e}", request.program.display());
            return write_frame(&mut write_half, REFUSED, why.as_bytes()).await;
        }
    };
    let pid = child.id().ok_or("the program ended before it started")?;
    let (tx, mut rx) = mpsc::channel::<(u8, Vec<u8>)>(64);
    let mut pumps = Vec::new();
    for (tag, pipe) in [
        (
            STDOUT,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn AsyncRead + Send + Unpin>),
        ),
        (
            STDERR,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn AsyncRead + Send + Unpin>),
        ),
    ] {
        let (tx, mut pipe) = (tx.clone(), pipe.ok_or("no pipe")?);
        pumps.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 || tx.send((tag, buf[..n].to_vec())).await.is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let writer = tokio::spawn(async move {
        while let Some((tag, data)) = rx.recv().await {
            if write_frame(&mut write_half, tag, &data).await.is_err() {
                break;
            }
        }
        write_half
    });
    // The client's frames; its end (a client killed) ends the program.
    let mut stdin = child.stdin.take();
    let client = async {
        loop {
            match read_frame(&mut input).await {
                Ok(Some((STDIN, data))) if data.is_empty() => stdin = None,
                Ok(Some((STDIN, data))) => {
                    if let Some(pipe) = stdin.as_mut() {
                        if pipe.write_all(&data).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Ok(Some((SIGNAL, data))) => {
                    if let Ok(signal) = as_i32(&data) {
                        signal_process(pid, signal).await;
                    }
                }
                _ => return,
            }
        }
    };
    let status = tokio::select! {
        status = child.wait() => Some(status?),
        () = client => None,
    };
    let Some(status) = status else {
        // The client is gone: so is its program.
        child.kill().await?;
        return Ok(());
    };
    // What the program wrote before it ended, then its status.
    // (A pipe a child of the program still holds is cut after 5 s.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for mut pump in pumps {
        if tokio::time::timeout_at(deadline, &mut pump).await.is_err() {
            pump.abort();
        }
    }
    let mut write_half = writer.await?;
    let code = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 255,
    };
    write_frame(&mut write_half, EXIT, &code.to_be_bytes()).await
}

/// Sends `signal` to process `pid` (with kill(1): no FFI outside `sys`).
async fn signal_process(pid: u32, signal: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .await;
}

/// The program the guest would have run for `name`: the CSI tools' folder
/// (`PILLAR_LAB_GO_BIN`) first, as [`crate::k8s::sidecar_binary`] looks,
/// then the PATH, less the folder of the links (`own_dir`).
pub fn real_program(name: &str, own_dir: &Path) -> Result<PathBuf> {
    let go_bin = std::env::var_os("PILLAR_LAB_GO_BIN").map(PathBuf::from);
    let path = std::env::var_os("PATH").unwrap_or_default();
    go_bin
        .into_iter()
        .chain(std::env::split_paths(&path))
        .filter(|dir| dir != own_dir)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} is not on the PATH: run `make deps`").into())
}

/// Whether a program run with `args` reads its standard input: an
/// argument `-` (`kubectl apply -f -`, `helm -f -`), `/dev/stdin`, or a
/// flag's value of either (`--filename=-`). Other programs' input is left
/// alone, as a program that never reads it leaves it: a script's
/// `kubectl get` before its `grpcurl -d @` leaves the heredoc to grpcurl.
pub fn reads_stdin(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "-" || a == "/dev/stdin" || a.ends_with("=-") || a.ends_with("=/dev/stdin"))
}

/// The client: runs `name` with `args` on the host and returns the exit
/// status to exit with, having written its output to this process's own.
pub async fn forward(name: &str, own_dir: &Path, args: Vec<String>) -> Result<i32> {
    let address = std::env::var(ADDRESS_VAR).map_err(|_| format!("{ADDRESS_VAR} is not set"))?;
    let token_file = std::env::var(TOKEN_VAR).map_err(|_| format!("{TOKEN_VAR} is not set"))?;
    let request = Request {
        token: std::fs::read_to_string(&token_file)?.trim().to_owned(),
        program: real_program(name, own_dir)?,
        args,
        cwd: std::env::current_dir()?,
        env: std::env::vars().filter(|(k, _)| k != "PATH").collect(),
    };
    let forwards_stdin = reads_stdin(&request.args);
    let stream = TcpStream::connect(&address)
        .await
        .map_err(|e| format!("the host's program server at {address}: {e}"))?;
    stream.set_nodelay(true)?;
    let (mut input, mut output) = stream.into_split();
    let mut line = serde_json::to_vec(&request)?;
    line.push(b'\n');
    output.write_all(&line).await?;

    let (tx, mut rx) = mpsc::channel::<(u8, Vec<u8>)>(16);
    let stdin_tx = tx.clone();
    tokio::spawn(async move {
        if !forwards_stdin {
            let _ = stdin_tx.send((STDIN, Vec::new())).await;
            return;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = stdin.read(&mut buf).await.unwrap_or(0);
            if stdin_tx.send((STDIN, buf[..n].to_vec())).await.is_err() || n == 0 {
                return;
            }
        }
    });
    for kind in [
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::hangup(),
    ] {
        let mut signals = tokio::signal::unix::signal(kind)?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while signals.recv().await.is_some() {
                let number = kind.as_raw_value();
                if tx
                    .send((SIGNAL, number.to_be_bytes().to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    drop(tx);
    tokio::spawn(async move {
        while let Some((tag, data)) = rx.recv().await {
            if write_frame(&mut output, tag, &data).await.is_err() {
                return;
            }
        }
    });

    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    while let Some((tag, data)) = read_frame(&mut input).await? {
        match tag {
            STDOUT => {
                stdout.write_all(&data).await?;
                stdout.flush().await?;
            }
            STDERR => {
                stderr.write_all(&data).await?;
                stderr.flush().await?;
            }
            EXIT => return as_i32(&data),
            REFUSED => {
                return Err(format!(
                    "the host did not run {name}: {}",
                    String::from_utf8_lossy(&data)
                )
                .into())
            }
            other => return Err(format!("an unknown frame {other} from the host").into()),
        }
    }
    Err(format!("the host's program server closed before {name} ended").into())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const TOKEN: &str = "t0ken";

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn only_arguments_that_name_it_forward_standard_input() {
        assert!(reads_stdin(&strings(&["apply", "-f", "-"])));
        assert!(reads_stdin(&strings(&["apply", "--filename=-"])));
        assert!(reads_stdin(&strings(&["create", "-f", "/dev/stdin"])));
        assert!(!reads_stdin(&strings(&["get", "pillaragent", "storage-1"])));
        assert!(!reads_stdin(&strings(&[
            "get",
            "pods",
            "-o",
            "jsonpath={.a-b}"
        ])));
    }

    /// A folder with an executable `kubectl` running `script` (sh).
    fn program(script: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubectl");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, path)
    }

    fn request(program: &Path, args: &[&str]) -> Request {
        Request {
            token: TOKEN.into(),
            program: program.to_owned(),
            args: strings(args),
            cwd: std::env::temp_dir(),
            env: vec![("LAB_WORD".into(), "seen".into())],
        }
    }

    #[test]
    fn requests_outside_the_rules_are_refused_with_the_reason() {
        let (_dir, kubectl) = program("true");
        assert_eq!(refusal(&request(&kubectl, &[]), TOKEN), None);
        let wrong = Request {
            token: "other".into(),
            ..request(&kubectl, &[])
        };
        assert_eq!(refusal(&wrong, TOKEN).as_deref(), Some("wrong token"));
        let shell = refusal(&request(Path::new("/bin/sh"), &[]), TOKEN).unwrap();
        assert!(
            shell.contains("/bin/sh is not one of the programs"),
            "{shell}"
        );
        let relative = refusal(&request(Path::new("kubectl"), &[]), TOKEN).unwrap();
        assert!(relative.contains("not one of the programs"), "{relative}");
        let gone = Request {
            cwd: PathBuf::from("/nonexistent/guest-only"),
            ..request(&kubectl, &[])
        };
        let why = refusal(&gone, TOKEN).unwrap();
        assert!(
            why.contains("/nonexistent/guest-only is not on the host"),
            "{why}"
        );
    }

    /// A server on a free port of 127.0.0.1, and a connection to it with
    /// `request` sent.
    async fn connect(request: &Request) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, TOKEN.into()));
        let mut stream = TcpStream::connect(address).await.unwrap();
        let mut line = serde_json::to_vec(request).unwrap();
        line.push(b'\n');
        stream.write_all(&line).await.unwrap();
        stream
    }

    /// The server's frames until EXIT or REFUSED: stdout, stderr, the end.
    async fn outcome(stream: &mut TcpStream) -> (String, String, (u8, Vec<u8>)) {
        let (mut out, mut err) = (String::new(), String::new());
        loop {
            let (tag, data) = read_frame(stream).await.unwrap().expect("a frame");
            match tag {
                STDOUT => out.push_str(&String::from_utf8_lossy(&data)),
                STDERR => err.push_str(&String::from_utf8_lossy(&data)),
                _ => return (out, err, (tag, data)),
            }
        }
    }

    #[tokio::test]
    async fn the_program_gets_arguments_environment_and_input_and_returns_output_and_status() {
        let (_dir, kubectl) =
            program("echo \"args: $*\"; echo \"env: $LAB_WORD\" >&2; echo \"in: $(cat)\"; exit 3");
        let mut stream = connect(&request(&kubectl, &["apply", "-f", "-"])).await;
        write_frame(&mut stream, STDIN, b"kind: Pod").await.unwrap();
        write_frame(&mut stream, STDIN, b"").await.unwrap();
        let (out, err, (tag, data)) = outcome(&mut stream).await;
        assert_eq!(out, "args: apply -f -\nin: kind: Pod\n");
        assert_eq!(err, "env: seen\n");
        assert_eq!((tag, as_i32(&data).unwrap()), (EXIT, 3));
    }

    #[tokio::test]
    async fn a_signal_reaches_the_program_and_its_status_says_so() {
        let (_dir, kubectl) = program("echo up; exec sleep 60");
        let mut stream = connect(&request(&kubectl, &[])).await;
        write_frame(&mut stream, STDIN, b"").await.unwrap();
        let (tag, data) = read_frame(&mut stream).await.unwrap().unwrap();
        assert_eq!((tag, data.as_slice()), (STDOUT, b"up\n".as_slice()));
        write_frame(&mut stream, SIGNAL, &15i32.to_be_bytes())
            .await
            .unwrap();
        let (_, _, (tag, data)) = outcome(&mut stream).await;
        assert_eq!((tag, as_i32(&data).unwrap()), (EXIT, 128 + 15));
    }

    #[tokio::test]
    async fn a_client_that_goes_away_takes_its_program_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let (_prog, kubectl) = program(&format!("echo $$ >{}; exec sleep 60", pid_file.display()));
        let stream = connect(&request(&kubectl, &[])).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Ok(pid) = std::fs::read_to_string(&pid_file) {
                if !pid.trim().is_empty() {
                    break pid.trim().to_owned();
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the program never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        drop(stream);
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        while proc_dir.exists() {
            // A reaped process's folder goes; a zombie's status says Z.
            let state = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
            if state.split_whitespace().nth(2) == Some("Z") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the program outlived its client"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_program_whose_child_keeps_its_output_open_still_ends() {
        let (_dir, kubectl) = program("sleep 30 & echo started; exit 0");
        let mut stream = connect(&request(&kubectl, &[])).await;
        let (out, _, (tag, data)) =
            tokio::time::timeout(Duration::from_secs(15), outcome(&mut stream))
                .await
                .expect("the exit status within 15 s");
        assert_eq!(out, "started\n");
        assert_eq!((tag, as_i32(&data).unwrap()), (EXIT, 0));
    }

    #[tokio::test]
    async fn a_refused_request_runs_nothing_and_says_why() {
        let mut stream = connect(&request(Path::new("/bin/rm"), &["-rf", "/tmp/x"])).await;
        let (_, _, (tag, data)) = outcome(&mut stream).await;
        assert_eq!(tag, REFUSED);
        assert!(String::from_utf8_lossy(&data).contains("/bin/rm is not one of the programs"));
    }
}
