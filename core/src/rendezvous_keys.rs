//! Who may write each rendezvous key: exactly one rank of the job, read from
//! the key itself. The coordinator refuses a write by any other rank
//! (`WorkerService.RendezvousPut`), and workers build their keys with the
//! same rule, so that a reader asks for the key its writer owns. Nodes
//! under test are not trusted: if a key went to whoever wrote it first, one
//! rank could plant another's address (a probe had rank 2 write rank 0's
//! pair address, and rank 0 connect to `6.6.6.6:6666`).
//!
//! The shapes, N a global rank of the job:
//! * `…@N` (any key ending in a writer suffix): rank N's;
//! * `tcp/addr/N` and `barrier/NAME/N`: rank N's;
//! * `nccl/id` and `barrier/NAME/done`: rank 0's.
//!
//! Any other key names no writer and nobody may write it. Keys of a group
//! smaller than the job (a pair's communicator, a node's) carry the suffix:
//! the worker's `Scoped` rendezvous turns a group's `tcp/addr/{g}` into
//! `{prefix}/tcp/addr/{g}@{global rank of g}`.

/// The rank that alone may write `key`; `None` when the key names none.
pub fn writer(key: &str) -> Option<u32> {
    split(key).map(|(_, w)| w)
}

/// `key` without its writer suffix, and its writer; `None` when the key
/// names no writer. A key with no suffix is its own base.
pub fn split(key: &str) -> Option<(&str, u32)> {
    if let Some((base, w)) = key.rsplit_once('@') {
        // A malformed suffix does not fall back to the shapes below: a
        // key with an `@` says its writer there or names none.
        return Some((base, rank(w)?));
    }
    if key == "nccl/id" {
        return Some((key, 0));
    }
    if let Some(r) = key.strip_prefix("tcp/addr/") {
        return Some((key, rank(r)?));
    }
    let (name, last) = key.strip_prefix("barrier/")?.rsplit_once('/')?;
    if name.is_empty() {
        return None;
    }
    if last == "done" {
        return Some((key, 0));
    }
    Some((key, rank(last)?))
}

/// `base` as a key that rank `writer` owns.
pub fn owned(base: &str, writer: u32) -> String {
    format!("{base}@{writer}")
}

/// Digits only: `+3` or ` 3` would be other keys owned by rank 3, which
/// no reader asks for.
fn rank(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_names_its_writer() {
        assert_eq!(writer("tcp/addr/3"), Some(3));
        assert_eq!(writer("nccl/id"), Some(0));
        assert_eq!(writer("barrier/start/5"), Some(5));
        assert_eq!(writer("barrier/pairs-2/done"), Some(0));
        assert_eq!(writer("barrier/p2p-host/0/1/1/7"), Some(7));
        assert_eq!(writer("pairs/0/1-2/tcp/addr/1@6"), Some(6));
        assert_eq!(writer("pairs/0/1-2/nccl/id@2"), Some(2));
        assert_eq!(writer("bisect/3/1/comm/barrier/x/done@8"), Some(8));
        assert_eq!(writer("pairs/shape@0"), Some(0));
        assert_eq!(writer("pairs/ranks/2@4"), Some(4));
        assert_eq!(writer("bisect/0/1@2"), Some(2));
        assert_eq!(writer("p2p-turns@9"), Some(9));
        assert_eq!(split("p2p/1/tcp/addr/0@2"), Some(("p2p/1/tcp/addr/0", 2)));
        assert_eq!(split("tcp/addr/1"), Some(("tcp/addr/1", 1)));
        assert_eq!(owned("pairs/shape", 0), "pairs/shape@0");
        assert_eq!(writer(&owned("a/b", 4_000_000_000)), Some(4_000_000_000));
    }

    #[test]
    fn keys_that_name_no_writer_are_nobody_s() {
        for key in [
            // Group keys without a suffix: once first-writer-wins.
            "pairs/0/1-2/tcp/addr/1",
            "pairs/0/1-2/nccl/id",
            "pairs/shape",
            "pairs/ranks/1",
            "bisect/0/1",
            "p2p/0/rank/1",
            "p2p-turns/max",
            // Malformed ranks and suffixes.
            "tcp/addr/x",
            "tcp/addr/",
            "tcp/addr/+3",
            "tcp/addr/ 3",
            "tcp/addr/99999999999",
            "tcp/addr/3@",
            "tcp/addr/3@x",
            "a@-1",
            "a@1@",
            "barrier/x/+1",
            "barrier/done",
            "barrier//done",
            "barrier/a@b/3",
            "nccl/id/",
            "",
        ] {
            assert_eq!(writer(key), None, "{key:?}");
        }
    }
}
