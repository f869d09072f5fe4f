//! A waiting call's headers, held as one block of bytes until its turn.
//!
//! At a 131,072-rank job's end tens of thousands of results wait at the
//! gate at once, each with the `HeaderMap` h2 decoded its headers into:
//! room for six (~670 bytes) and an allocation for each value and each
//! name outside HTTP's standard ones. Packed, a worker's call holds 571
//! bytes less while it waits (`coordinator/tests/gate_memory.rs`: 1,471 →
//! 900 bytes a waiting call). The headers are put back as they were
//! (names, values, their order under each name, the sensitive flag) before
//! the call goes on, so nothing after the gate reads them differently.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Each value as: its name's length (u32 LE), the name, a byte that says
/// whether it is sensitive, the value's length (u32 LE), the value.
pub(super) struct Packed(Box<[u8]>);

const SENSITIVE: u8 = 1;

impl Packed {
    /// Takes `headers`, leaving them empty.
    pub(super) fn take(headers: &mut HeaderMap) -> Packed {
        let map = std::mem::take(headers);
        let len = map
            .iter()
            .map(|(n, v)| 9 + n.as_str().len() + v.len())
            .sum();
        let mut out = Vec::with_capacity(len);
        // `iter` gives every value, those of one name one after the other
        // in the order they were added: appended again in that order,
        // each name's values read as before.
        for (name, value) in &map {
            put(&mut out, name.as_str().as_bytes());
            out.push(if value.is_sensitive() { SENSITIVE } else { 0 });
            put(&mut out, value.as_bytes());
        }
        Packed(out.into_boxed_slice())
    }

    /// Puts the headers back into `headers` (emptied by [`Packed::take`]).
    pub(super) fn restore(self, headers: &mut HeaderMap) {
        let mut map = HeaderMap::with_capacity(self.entries().count());
        for (name, value, sensitive) in self.entries() {
            // They were a valid name and value when taken: only a bug fails
            // either, and then the call goes on without that header (a
            // secret lost is refused as missing), not a panic on a node's
            // call.
            let (Ok(name), Ok(mut value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            else {
                debug_assert!(false, "a header taken valid does not come back");
                continue;
            };
            value.set_sensitive(sensitive);
            map.append(name, value);
        }
        *headers = map;
    }

    fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8], bool)> {
        let mut rest: &[u8] = &self.0;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let name = cut(&mut rest);
            let sensitive = rest[0] == SENSITIVE;
            rest = &rest[1..];
            let value = cut(&mut rest);
            Some((name, value, sensitive))
        })
    }
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    // A header list is bounded by SETTINGS_MAX_HEADER_LIST_SIZE, far below
    // 4 GiB.
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn cut<'a>(rest: &mut &'a [u8]) -> &'a [u8] {
    let (len, tail) = rest.split_at(4);
    let len = u32::from_le_bytes(len.try_into().expect("four bytes")) as usize;
    let (bytes, tail) = tail.split_at(len);
    *rest = tail;
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_come_back_as_they_were_taken() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.append("x-many", HeaderValue::from_static("one"));
        h.insert("grpc-timeout", HeaderValue::from_static("19999m"));
        h.append("x-many", HeaderValue::from_static("two"));
        h.append("x-many", HeaderValue::from_bytes(b"three \xff").unwrap());
        let mut secret = HeaderValue::from_static("s3cr3t");
        secret.set_sensitive(true);
        h.insert(gpuctl_core::auth::RANK_SECRET, secret);
        h.insert("x-empty", HeaderValue::from_static(""));
        let before = h.clone();

        let packed = Packed::take(&mut h);
        assert!(h.is_empty(), "taken, not copied");
        packed.restore(&mut h);

        assert_eq!(h, before);
        let many: Vec<&[u8]> = h.get_all("x-many").iter().map(|v| v.as_bytes()).collect();
        assert_eq!(many, [&b"one"[..], b"two", b"three \xff"]);
        assert!(h[gpuctl_core::auth::RANK_SECRET].is_sensitive());
        assert!(!h["te"].is_sensitive());
    }
}
