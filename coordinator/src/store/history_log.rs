//! What the fleet history reads (runs, acceptances, the inventory) counted
//! as a version, and, for the fleet view, the writes since a version it
//! built at: it folds in a job's runs instead of reading every node's
//! history again. Writes are kept only while a reader armed the log (the
//! view holds an answer), and at most [`LOG_BYTES`] of them: past that they
//! go, and the reader is told to build afresh. One reader: the fleet view.

use std::sync::Arc;

/// What the log holds at most: a 16,384-node job's runs are ~16 MB.
pub const LOG_BYTES: usize = 64 << 20;

/// A write of a key the fleet history reads.
#[derive(Debug, Clone)]
pub struct HistoryWrite {
    pub key: String,
    /// `None`: deleted.
    pub value: Option<Arc<Vec<u8>>>,
}

/// The writes after a version, as [`HistoryLog::since`] answers.
#[derive(Debug)]
pub enum Since {
    /// Nothing written since.
    Same,
    /// These, in order, which make the version the first field.
    Writes(u64, Vec<HistoryWrite>),
    /// Not kept (not armed at that version, or past [`LOG_BYTES`]).
    Unknown,
}

#[derive(Debug, Default)]
pub struct HistoryLog {
    version: u64,
    armed: bool,
    /// The version the kept writes follow.
    from: u64,
    writes: Vec<HistoryWrite>,
    bytes: usize,
    overflowed: bool,
}

impl HistoryLog {
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Counts a write of `entries` (whatever their keys) when one is a
    /// history input (`input`), and keeps those while armed.
    pub fn record<'a>(
        &mut self,
        entries: impl IntoIterator<Item = (&'a String, Option<&'a Arc<Vec<u8>>>)>,
        input: impl Fn(&str) -> bool,
    ) {
        let mut any = false;
        for (key, value) in entries {
            if !input(key) {
                continue;
            }
            any = true;
            if !self.armed || self.overflowed {
                continue;
            }
            self.bytes += key.len() + value.map_or(0, |v| v.len());
            if self.bytes > LOG_BYTES {
                self.overflowed = true;
                self.writes = Vec::new();
                continue;
            }
            self.writes.push(HistoryWrite {
                key: key.clone(),
                value: value.cloned(),
            });
        }
        if any {
            self.version += 1;
        }
    }

    /// Keeps every write from now on; returns the version they follow.
    pub fn arm(&mut self) -> u64 {
        self.armed = true;
        self.from = self.version;
        self.writes = Vec::new();
        self.bytes = 0;
        self.overflowed = false;
        self.version
    }

    /// Keeps no more writes (no reader holds an answer).
    pub fn disarm(&mut self) {
        self.armed = false;
        self.writes = Vec::new();
        self.bytes = 0;
    }

    /// The writes after version `v`, handed over: the log then follows the
    /// version it answers with.
    pub fn since(&mut self, v: u64) -> Since {
        if v == self.version {
            return Since::Same;
        }
        if !self.armed || self.overflowed || self.from != v {
            return Since::Unknown;
        }
        self.from = self.version;
        self.bytes = 0;
        Since::Writes(self.version, std::mem::take(&mut self.writes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(log: &mut HistoryLog, key: &str, bytes: usize) {
        let (k, v) = (key.to_string(), Arc::new(vec![0; bytes]));
        log.record([(&k, Some(&v))], |k| k.starts_with("history/"));
    }

    #[test]
    fn writes_are_kept_from_the_armed_version_on_and_within_their_bytes() {
        let mut log = HistoryLog::default();
        put(&mut log, "history/a/1", 10);
        put(&mut log, "jobs/1", 10);
        assert_eq!(log.version(), 1, "only history inputs count");
        assert!(matches!(log.since(0), Since::Unknown), "not armed");

        let v = log.arm();
        assert!(matches!(log.since(v), Since::Same));
        put(&mut log, "history/a/2", 10);
        let k = "history/a/1".to_string();
        log.record([(&k, None)], |k| k.starts_with("history/"));
        let Since::Writes(now, w) = log.since(v) else {
            panic!("armed at {v}")
        };
        assert_eq!(now, v + 2);
        let keys: Vec<(&str, bool)> = w
            .iter()
            .map(|w| (w.key.as_str(), w.value.is_some()))
            .collect();
        assert_eq!(keys, [("history/a/2", true), ("history/a/1", false)]);
        assert!(matches!(log.since(v), Since::Unknown), "handed over");
        assert!(matches!(log.since(now), Since::Same));

        put(&mut log, "history/b/1", LOG_BYTES);
        assert!(matches!(log.since(now), Since::Unknown), "past its bytes");
        let v = log.arm();
        log.disarm();
        put(&mut log, "history/b/2", 1);
        assert!(matches!(log.since(v), Since::Unknown), "disarmed");
    }
}
