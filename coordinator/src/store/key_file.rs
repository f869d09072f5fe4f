//! The workers' key in a file of its own: hex, owner-only (0600), created
//! so that no other user ever reads it, whatever the umask. One found
//! readable by others (restored from a backup with 0644, say) is made 0600
//! again, with a warning: the coordinator keeps its key and its jobs, and
//! the operator learns the key may have been read.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use tracing::warn;

use gpuctl_core::auth::{RankKey, KEY_BYTES};

use super::backend::{Store, StoreError, StoreResult};
use super::keys;

/// The key in `path`: read, or moved there from `store` (where an older
/// coordinator kept it), or made.
pub async fn load(store: &dyn Store, path: &Path) -> StoreResult<RankKey> {
    let bad = |why: String| StoreError::Backend(format!("{}: {why}", path.display()));
    if let Some(key) = read(path).map_err(bad)? {
        return Ok(key);
    }
    let stored = store.get(keys::RANK_KEY.to_string()).await?;
    let key = match stored.as_deref().and_then(RankKey::from_bytes) {
        Some(k) => k,
        None => RankKey::generate()
            .map_err(|e| StoreError::Backend(format!("no random bytes for a key: {e}")))?,
    };
    write(path, &key).map_err(|e| bad(e.to_string()))?;
    if stored.is_some() {
        store.delete(keys::RANK_KEY.to_string()).await?;
    }
    Ok(key)
}

/// The key in the file at `path`, `None` when there is no file; made
/// owner-only first if others may read it.
fn read(path: &Path) -> Result<Option<RankKey>, String> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mode = f
        .metadata()
        .map_err(|e| e.to_string())?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| {
                format!(
                    "mode {mode:03o} lets other users read the workers' key, and making it 0600 failed ({e}): run `chmod 600 {}` as its owner",
                    path.display()
                )
            })?;
        warn!(
            path = %path.display(),
            "the workers' key file had mode {mode:03o}, readable by other users: made it 0600. If someone else may have read it, delete the file and restart the coordinator while no job runs: a new key is made"
        );
    }
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(|e| e.to_string())?;
    parse(text.trim())
        .map(Some)
        .ok_or_else(|| format!("not a key of {KEY_BYTES} bytes in hex"))
}

/// The key written as hex; `None` for anything else.
pub fn parse(hex: &str) -> Option<RankKey> {
    if hex.len() != KEY_BYTES * 2 || !hex.is_ascii() {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..KEY_BYTES)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect();
    RankKey::from_bytes(&bytes?)
}

/// Writes `key` to a new file at `path`, mode 0600 from its creation; an
/// existing file is left alone (an error).
pub fn write(path: &Path, key: &RankKey) -> std::io::Result<()> {
    let hex: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(hex.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_owner_only_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rank.key");
        let key = RankKey::generate().unwrap();
        write(&p, &key).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let back = parse(std::fs::read_to_string(&p).unwrap().trim()).unwrap();
        assert_eq!(back.as_bytes(), key.as_bytes());
        assert!(write(&p, &key).is_err(), "never overwritten");
        assert!(parse("abc").is_none());
        assert!(parse(&"zz".repeat(KEY_BYTES)).is_none());
    }

    /// Issue 46: a key file found with mode 0644 stayed readable by every
    /// user of the host, with no word.
    #[test]
    fn a_key_file_readable_by_others_is_made_owner_only_and_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rank.key");
        let key = RankKey::generate().unwrap();
        write(&p, &key).unwrap();
        for loose in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(loose)).unwrap();
            let back = read(&p).unwrap().expect("the key");
            assert_eq!(back.as_bytes(), key.as_bytes());
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "from {loose:o}");
        }
        assert!(read(&dir.path().join("none")).unwrap().is_none());
        std::fs::write(dir.path().join("bad"), "zz").unwrap();
        let e = read(&dir.path().join("bad")).unwrap_err();
        assert!(e.contains("not a key"), "{e}");
    }
}
