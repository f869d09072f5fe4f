//! The workers' key in a file of its own: hex, owner-only (0600), created
//! so that no other user ever reads it, whatever the umask.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use gpuctl_core::auth::{RankKey, KEY_BYTES};

use super::{keys, Store, StoreError, StoreResult};

/// The key in `path`: read, or moved there from `store` (where an older
/// coordinator kept it), or made.
pub async fn load(store: &dyn Store, path: &Path) -> StoreResult<RankKey> {
    let bad = |why: String| StoreError::Backend(format!("{}: {why}", path.display()));
    match std::fs::read_to_string(path) {
        Ok(text) => {
            return parse(text.trim())
                .ok_or_else(|| bad(format!("not a key of {KEY_BYTES} bytes in hex")))
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(bad(e.to_string())),
        Err(_) => {}
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
    use std::os::unix::fs::PermissionsExt;

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
}
