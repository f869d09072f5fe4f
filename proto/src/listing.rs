//! `NodeTable`, the brief listing of nodes (`ListNodesRequest.brief`): a
//! builder that fills its columns and dictionaries, and rows read back out
//! of it without copying a string. And the fleet's packed pages
//! (`GetFleetRequest.packed`) read back into rows.

use std::ops::Range;

use std::collections::HashMap;

use crate::pb::{FleetRow, GetFleetResponse, NodeState, NodeTable};

/// One node as a table of nodes shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeRow<'a> {
    pub name: &'a str,
    pub state: NodeState,
    /// GPUs, else CPU ranks.
    pub slots: u32,
    pub last_heartbeat_unix_ms: u64,
    /// 0: unknown.
    pub shm_bytes: u64,
    /// The GPU model(s), ", " between models; empty for a CPU node.
    pub model: &'a str,
    /// The job it runs; empty for none.
    pub job: &'a str,
    pub reason: &'a str,
}

impl NodeTable {
    pub fn len(&self) -> usize {
        self.name_len.len()
    }

    pub fn is_empty(&self) -> bool {
        self.name_len.is_empty()
    }

    /// Row `i`. A column shorter than `name_len` (a malformed answer) reads
    /// as its default, never out of bounds, as does a name past the end of
    /// `names` or not cut at a character's boundary.
    pub fn row(&self, i: usize) -> NodeRow<'_> {
        self.row_at(i, self.name_at(i))
    }

    /// Every row, in order; names are cut in one pass.
    pub fn rows(&self) -> impl Iterator<Item = NodeRow<'_>> {
        let mut start = 0usize;
        self.name_len.iter().enumerate().map(move |(i, &len)| {
            let end = start.saturating_add(len as usize);
            let name = start..end;
            start = end;
            self.row_at(i, name)
        })
    }

    fn name_at(&self, i: usize) -> Range<usize> {
        let start: usize = self.name_len.iter().take(i).map(|&l| l as usize).sum();
        let len = self.name_len.get(i).copied().unwrap_or(0) as usize;
        start..start.saturating_add(len)
    }

    fn row_at(&self, i: usize, name: Range<usize>) -> NodeRow<'_> {
        NodeRow {
            name: self.names.get(name).unwrap_or(""),
            state: self
                .state
                .get(i)
                .and_then(|&s| NodeState::try_from(s).ok())
                .unwrap_or_default(),
            slots: self.slots.get(i).copied().unwrap_or(0),
            last_heartbeat_unix_ms: self.last_heartbeat_unix_ms.get(i).copied().unwrap_or(0),
            shm_bytes: self.shm_bytes.get(i).copied().unwrap_or(0),
            model: word(&self.models, self.model.get(i)),
            job: word(&self.jobs, self.job.get(i)),
            reason: self.reason.get(&(i as u32)).map_or("", String::as_str),
        }
    }
}

/// The dictionary's word at `at`; "" where there is none.
fn word<'a>(dict: &'a [String], at: Option<&u32>) -> &'a str {
    at.and_then(|&k| dict.get(k as usize))
        .map_or("", String::as_str)
}

/// Fills a [`NodeTable`] row by row, each model and job string sent once.
#[derive(Default)]
pub struct TableBuilder {
    table: NodeTable,
    models: Dict,
    jobs: Dict,
}

impl TableBuilder {
    pub fn with_capacity(rows: usize) -> TableBuilder {
        let table = NodeTable {
            // Names of a dozen bytes or so.
            names: String::with_capacity(rows * 16),
            name_len: Vec::with_capacity(rows),
            state: Vec::with_capacity(rows),
            slots: Vec::with_capacity(rows),
            last_heartbeat_unix_ms: Vec::with_capacity(rows),
            shm_bytes: Vec::with_capacity(rows),
            model: Vec::with_capacity(rows),
            job: Vec::with_capacity(rows),
            ..Default::default()
        };
        let mut b = TableBuilder {
            table,
            models: Dict::default(),
            jobs: Dict::default(),
        };
        // "" first in each: no GPU, no job.
        b.models.intern(&mut b.table.models, "");
        b.jobs.intern(&mut b.table.jobs, "");
        b
    }

    pub fn push(&mut self, row: NodeRow<'_>) {
        let t = &mut self.table;
        let i = t.name_len.len() as u32;
        t.names.push_str(row.name);
        t.name_len.push(row.name.len() as u32);
        t.state.push(row.state as i32);
        t.slots.push(row.slots);
        t.last_heartbeat_unix_ms.push(row.last_heartbeat_unix_ms);
        t.shm_bytes.push(row.shm_bytes);
        t.model.push(self.models.intern(&mut t.models, row.model));
        t.job.push(self.jobs.intern(&mut t.jobs, row.job));
        if !row.reason.is_empty() {
            t.reason.insert(i, row.reason.to_string());
        }
    }

    pub fn finish(self) -> NodeTable {
        self.table
    }
}

/// A dictionary column: the words so far, where each is, and the last
/// row's, since neighbours mostly share a model and a job (no hashing for
/// those).
#[derive(Default)]
struct Dict {
    index: HashMap<String, u32>,
    last: u32,
}

impl Dict {
    fn intern(&mut self, words: &mut Vec<String>, word: &str) -> u32 {
        if words.get(self.last as usize).is_some_and(|w| w == word) {
            return self.last;
        }
        let k = match self.index.get(word) {
            Some(&k) => k,
            None => {
                let k = words.len() as u32;
                words.push(word.to_string());
                self.index.insert(word.to_string(), k);
                k
            }
        };
        self.last = k;
        k
    }
}

impl GetFleetResponse {
    /// A packed page's rows (`rows_packed`) moved into `rows`, after those
    /// it carried already; a page that is not packed is left as it is.
    pub fn unpack(&mut self) -> Result<(), prost::DecodeError> {
        if self.rows_packed.is_empty() {
            return Ok(());
        }
        let packed = std::mem::take(&mut self.rows_packed);
        // Counted first, so the rows are made in place, once: decoded as a
        // message, 16,384 rows (5 MB) grew a vector by doubling, each
        // step copied and its pages touched anew, and were then copied
        // again onto `rows`.
        let Some(n) = records(&packed) else {
            let mut more = <GetFleetResponse as prost::Message>::decode(packed)?;
            self.rows.append(&mut more.rows);
            return Ok(());
        };
        self.rows.reserve_exact(n);
        let mut buf = packed;
        while !buf.is_empty() {
            let _key = prost::encoding::decode_varint(&mut buf)?;
            let len = prost::encoding::decode_varint(&mut buf)? as usize;
            let row = buf.split_to(len);
            self.rows.push(<FleetRow as prost::Message>::decode(row)?);
        }
        Ok(())
    }
}

/// How many rows `packed` holds, when it is only rows (field 1, each
/// length-delimited and whole); `None` for anything else, which is then
/// decoded as the message it is.
fn records(packed: &[u8]) -> Option<usize> {
    const ROW_KEY: u64 = (1 << 3) | 2;
    let (mut buf, mut n) = (packed, 0usize);
    while !buf.is_empty() {
        if prost::encoding::decode_varint(&mut buf).ok()? != ROW_KEY {
            return None;
        }
        let len = usize::try_from(prost::encoding::decode_varint(&mut buf).ok()?).ok()?;
        buf = buf.get(len..)?;
        n += 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn row<'a>(name: &'a str, model: &'a str, job: &'a str, reason: &'a str) -> NodeRow<'a> {
        NodeRow {
            name,
            state: NodeState::Busy,
            slots: 8,
            last_heartbeat_unix_ms: 1_700_000_000_000,
            shm_bytes: 1 << 30,
            model,
            job,
            reason,
        }
    }

    #[test]
    fn rows_come_back_as_they_went_in_each_word_sent_once() {
        let rows = [
            row("a", "NVIDIA H200", "job-000001", ""),
            row(
                "b",
                "NVIDIA H200",
                "job-000001",
                "lost: no heartbeat for 30s",
            ),
            row("c", "", "", ""),
            row("d", "NVIDIA H100, NVIDIA H200", "job-000002", ""),
        ];
        let mut b = TableBuilder::with_capacity(rows.len());
        for r in rows {
            b.push(r);
        }
        let sent = b.finish().encode_to_vec();
        let table = NodeTable::decode(sent.as_slice()).unwrap();
        assert_eq!(table.rows().collect::<Vec<_>>(), rows);
        assert_eq!(
            table.models,
            ["", "NVIDIA H200", "NVIDIA H100, NVIDIA H200"]
        );
        assert_eq!(table.jobs, ["", "job-000001", "job-000002"]);
    }

    #[test]
    fn a_short_column_reads_as_its_default() {
        let table = NodeTable {
            names: "ab".into(),
            name_len: vec![1, 1],
            slots: vec![8],
            model: vec![0, 7],
            models: vec![String::new()],
            ..Default::default()
        };
        let b = table.row(1);
        assert_eq!((b.name, b.slots, b.model, b.job), ("b", 0, "", ""));
        assert_eq!(b.state, NodeState::default());
        // Names past the end, or not cut at a character's boundary.
        let table = NodeTable {
            names: "aé".into(),
            name_len: vec![2, 9],
            ..Default::default()
        };
        assert_eq!(table.rows().map(|r| r.name).collect::<Vec<_>>(), ["", ""]);
        assert_eq!(table.row(1).name, "");
    }

    fn fleet_row(node: &str) -> crate::pb::FleetRow {
        crate::pb::FleetRow {
            node: node.into(),
            last_job: "job-000004".into(),
            runs: 4,
            stress_tflops_worst: 650.5,
            drift: vec![crate::pb::Drift {
                metric: "stress_tflops".into(),
                flagged: true,
                ..Default::default()
            }],
            acceptance: Some(crate::pb::Acceptance {
                node: node.into(),
                suite_id: "suite-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn packed_rows_come_back_after_those_a_page_carried() {
        let rows: Vec<_> = ["a", "b", ""].into_iter().map(fleet_row).collect();
        let mut packed = Vec::new();
        for r in &rows {
            prost::encoding::message::encode(1, r, &mut packed);
        }
        let mut page = GetFleetResponse {
            rows: vec![fleet_row("first")],
            rows_packed: packed.clone().into(),
            next_after: "b".into(),
            ..Default::default()
        };
        page.unpack().unwrap();
        assert_eq!(page.rows[0].node, "first");
        assert_eq!(page.rows[1..], rows[..]);
        assert!(page.rows_packed.is_empty());
        assert_eq!(page.next_after, "b");

        // Cut short inside the last row: refused, as the message would be.
        let mut cut = GetFleetResponse {
            rows_packed: packed[..packed.len() - 3].to_vec().into(),
            ..Default::default()
        };
        assert!(cut.unpack().is_err());

        // Another field among the rows: read as the message it is.
        let mut other = packed.clone();
        prost::encoding::string::encode(4, &"c".to_string(), &mut other);
        let mut page = GetFleetResponse {
            rows_packed: other.into(),
            ..Default::default()
        };
        page.unpack().unwrap();
        assert_eq!(page.rows, rows);
    }
}
