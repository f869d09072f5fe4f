//! The workers' key in a file of its own: hex, owner-only (0600), created
//! so that no other user ever reads it, whatever the umask.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use gpuctl_proto::auth::{RankKey, KEY_BYTES};

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
