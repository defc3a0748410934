//! Data patterns written to and read back from block devices.
use crate::Result;
use std::{
    fs::OpenOptions,
    io::{Read, Seek, SeekFrom, Write},
    path::Path,
    thread,
    time::{Duration, Instant},
};

/// A deterministic pattern of `len` bytes derived from `seed`, different at
/// every offset, so a misplaced or stale block does not compare equal.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Writes `data` at `offset` and flushes it to the device.
pub fn write_at(dev: &Path, offset: u64, data: &[u8]) -> Result<()> {
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).open(dev)?;
        f.seek(SeekFrom::Start(offset))?;
        f.write_all(data)?;
        f.sync_all()
    };
    write().map_err(|e| {
        format!(
            "write {} bytes at {offset} of {}: {e}",
            data.len(),
            dev.display()
        )
        .into()
    })
}

/// Reads `len` bytes at `offset`, after dropping the device's page cache so
/// the bytes come from the device, not from an earlier read.
pub fn read_at(dev: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    crate::run("blockdev", &["--flushbufs", &dev.to_string_lossy()])?;
    let read = || -> std::io::Result<Vec<u8>> {
        let mut f = OpenOptions::new().read(true).open(dev)?;
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = vec![0; len];
        f.read_exact(&mut buf)?;
        Ok(buf)
    };
    read().map_err(|e| format!("read {len} bytes at {offset} of {}: {e}", dev.display()).into())
}

/// Waits until `path` exists, up to `timeout`.
pub fn wait_for(path: &Path, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > timeout {
            return Err(format!("{} did not appear within {timeout:?}", path.display()).into());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
