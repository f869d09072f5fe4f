//! Values larger than one etcd request, stored in parts.
//!
//! etcd refuses a request over `--max-request-bytes` (1.5 MiB by default,
//! about 10 MiB at most as etcd advises), and a job's report outgrows that
//! at about a thousand ranks: the report of a 1,024 × 8 stress job was not
//! stored, and its job had no report after a failover (docs/benchmarks.md).
//! A value over [`PART_BYTES`] is written as parts under
//! `{key}\0{generation}/{index}` and, at the key itself, a manifest naming
//! the generation, the part count and the length. Parts are written before
//! their manifest, and the manifest's transaction deletes every other
//! generation's parts, so a reader that sees a manifest finds its parts,
//! and a write cut halfway leaves the old value readable. Keys with a `\0`
//! are parts: scans leave them out and hand over the whole value instead.

use std::sync::atomic::{AtomicU64, Ordering};

/// The largest value stored whole, and the size of each part.
pub const PART_BYTES: usize = 512 * 1024;

/// A manifest starts with this: 0xff opens no protobuf message (wire type
/// 7 does not exist), nor JSON, so no stored value starts so by chance.
const MAGIC: &[u8] = b"\xffgpuctl-parts\x00";

/// Whether `key` (without the prefix, or with it) is a part of a larger value.
pub fn is_part(key: &str) -> bool {
    key.contains('\0')
}

/// Every part of `key` of any generation starts with this.
pub fn all_parts(full_key: &str) -> String {
    format!("{full_key}\0")
}

/// The parts of `key` of generation `generation` start with this.
pub fn parts_of(full_key: &str, generation: &str) -> String {
    format!("{full_key}\0{generation}/")
}

/// A fresh generation: 16 hex digits, unique in this process and, by the
/// clock, across coordinators.
pub fn generation() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:016x}",
        nanos.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
    )
}

/// What a manifest says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub generation: String,
    pub parts: u32,
    pub len: u64,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(self.generation.as_bytes());
        v.extend_from_slice(&self.parts.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v
    }

    /// The manifest `value` is, if it is one.
    pub fn decode(value: &[u8]) -> Option<Manifest> {
        let rest = value.strip_prefix(MAGIC)?;
        if rest.len() != 16 + 4 + 8 {
            return None;
        }
        let generation = std::str::from_utf8(&rest[..16]).ok()?.to_string();
        let parts = u32::from_le_bytes(rest[16..20].try_into().ok()?);
        let len = u64::from_le_bytes(rest[20..28].try_into().ok()?);
        Some(Manifest {
            generation,
            parts,
            len,
        })
    }
}

/// A part's key and bytes.
pub type Part = (String, Vec<u8>);

/// `value` cut into parts of `full_key` (their keys and bytes) and the
/// manifest that names them; `None` when it is small enough to store whole.
pub fn split(full_key: &str, value: &[u8]) -> Option<(Vec<Part>, Manifest)> {
    if value.len() <= PART_BYTES {
        return None;
    }
    let generation = generation();
    let base = parts_of(full_key, &generation);
    let parts: Vec<Part> = value
        .chunks(PART_BYTES)
        .enumerate()
        .map(|(i, c)| (format!("{base}{i:08}"), c.to_vec()))
        .collect();
    let manifest = Manifest {
        generation,
        parts: parts.len() as u32,
        len: value.len() as u64,
    };
    Some((parts, manifest))
}

/// The value a manifest names, from its parts in key order; `Err` says
/// what is missing.
pub fn join(manifest: &Manifest, parts: Vec<Vec<u8>>) -> Result<Vec<u8>, String> {
    if parts.len() != manifest.parts as usize {
        return Err(format!(
            "{} of its {} parts found",
            parts.len(),
            manifest.parts
        ));
    }
    let value = parts.concat();
    if value.len() as u64 != manifest.len {
        return Err(format!(
            "its parts hold {} bytes, not {}",
            value.len(),
            manifest.len
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_stay_whole_and_large_ones_round_trip() {
        assert!(split("/p/k", &[7u8; PART_BYTES]).is_none());
        let value: Vec<u8> = (0..PART_BYTES * 2 + 5).map(|i| i as u8).collect();
        let (parts, m) = split("/p/k", &value).unwrap();
        assert_eq!((parts.len(), m.parts, m.len), (3, 3, value.len() as u64));
        assert!(parts
            .iter()
            .all(|(k, _)| is_part(k) && k.starts_with(&parts_of("/p/k", &m.generation))));
        assert!(
            parts.windows(2).all(|w| w[0].0 < w[1].0),
            "parts sort in order"
        );
        assert_eq!(Manifest::decode(&m.encode()), Some(m.clone()));
        let bytes: Vec<Vec<u8>> = parts.into_iter().map(|(_, v)| v).collect();
        assert_eq!(join(&m, bytes.clone()).unwrap(), value);
        assert!(join(&m, bytes[..2].to_vec())
            .unwrap_err()
            .contains("2 of its 3"));
        // A protobuf or JSON value is never taken for a manifest.
        assert_eq!(Manifest::decode(b"\x0a\x03job"), None);
        assert_eq!(Manifest::decode(b"{\"a\":1}"), None);
        assert_ne!(generation(), generation());
    }
}
