//! The certificate itself: what one node was, what it was judged by and
//! what it scored, as the JSON a verifier reads. Plain serde structs, put
//! into the statement through `serde_json::Value`, whose objects keep their
//! keys sorted: one certificate always serialises to the same bytes (sorted
//! keys, no whitespace, shortest round-trip numbers), which the signature
//! covers and a verifier that re-serialises what it read gets back.

use serde::{Deserialize, Serialize};

/// The `predicateType` of the in-toto statement and the `schema` field.
pub const SCHEMA: &str = "https://gpuctl.dev/acceptance-certificate/v1";

/// One node's acceptance certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    pub schema: String,
    /// `cert-<suite>-<node>`: one per node and suite.
    pub id: String,
    pub issued_unix_ms: u64,
    pub expires_unix_ms: u64,
    pub issuer: Issuer,
    /// NVIDIA node-verdict's fields: the node, its status and what to do.
    pub node: String,
    /// PASS | WARNING | CRITICAL | UNKNOWN (node-verdict's words).
    pub status: String,
    /// gpuctl's verdict: pass | warn | fail | incomplete.
    pub verdict: String,
    /// Why it did not pass (empty when it did): the stage and reason.
    pub remediation: String,
    pub identity: Identity,
    pub suite: SuiteRecord,
    pub rules: RulesRecord,
    /// Every figure of the node, with its reference, thresholds and verdict.
    pub figures: Vec<FigureRecord>,
    /// What failed or warned on the node, as the reports said it.
    pub findings: Vec<FindingRecord>,
    /// The job reports the figures come from, by hash.
    pub evidence: Vec<EvidenceRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Issuer {
    /// The coordinator's host name and URL as it advertises itself.
    pub coordinator: String,
    /// SHA-256 of the public key's raw 32 bytes, hex: the DSSE `keyid`.
    pub key_id: String,
}

/// A node as its agent read it. Unreadable fields are empty, never absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub hostname: String,
    pub product_serial: String,
    pub board_serial: String,
    pub boot_id: String,
    pub os: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpu_count: u32,
    /// Ranks offered on a node without GPUs.
    pub cpu_ranks: u32,
    pub memory_total_bytes: u64,
    pub driver_version: String,
    pub cuda_driver_version: String,
    pub nccl_version: String,
    pub torch_version: String,
    pub agent_version: String,
    pub ib_devices: Vec<String>,
    pub gpus: Vec<GpuIdentity>,
}

/// One GPU: who it is, its firmware and how it is attached.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuIdentity {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub serial: String,
    pub board_part_number: String,
    pub vbios_version: String,
    pub inforom_image_version: String,
    pub memory_total_bytes: u64,
    pub pci_bus_id: String,
    pub pcie_gen_max: u32,
    pub pcie_width_max: u32,
    pub nvlinks_active: u32,
    /// The active NVLinks' remote ends, `<PCI bus id>x<links>` by bus id.
    pub nvlink_remotes: Vec<String>,
    /// `<index> <level>` to each other GPU: NVML's PCIe topology level.
    pub pcie_paths: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteRecord {
    pub id: String,
    pub name: String,
    pub state: String,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub stages: Vec<StageRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageRecord {
    pub name: String,
    pub workload: String,
    /// Empty for preflight and for stages the node did not reach.
    pub job_id: String,
    pub state: String,
    pub duration_ms: u64,
    /// Whether this node was still in when the stage began.
    pub took_part: bool,
    pub note: String,
}

/// The rules the figures were judged by: by value, and by content hash.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesRecord {
    /// SHA-256 (hex) of `effective`.
    pub sha256: String,
    /// The rules in force, built-in and overlays together, as text.
    pub effective: String,
    /// The rules text the suite was submitted with (`--rules`), if any.
    pub suite_rules: String,
}

/// One figure against its reference. The verdict is a function of the
/// other fields alone ([`crate::judge::verdict`]), which `verify` re-runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FigureRecord {
    pub stage: String,
    pub job_id: String,
    /// Absent for a figure of the job's ranks together.
    pub rank: Option<u32>,
    pub gpu_uuid: String,
    pub metric: String,
    pub key: String,
    pub unit: String,
    pub value: f64,
    /// What it was judged against: `fleet` (the job's median of its device
    /// class), `baseline`, `floor`, or `none` (not judged).
    pub reference_kind: String,
    pub reference: f64,
    pub higher_is_better: bool,
    /// Score = value / reference (reference / value when lower is better);
    /// below `fail_below` fails, below `warn_below` warns.
    pub fail_below: f64,
    pub warn_below: f64,
    /// Score − 1: how far above (+) or below (−) the reference.
    pub margin: f64,
    /// pass | warn | fail | unjudged.
    pub verdict: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FindingRecord {
    pub stage: String,
    pub job_id: String,
    pub level: String,
    pub metric: String,
    pub key: String,
    pub detail: String,
}

/// One job report kept as evidence: `file` in the exported folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceRecord {
    pub job_id: String,
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
}

impl Certificate {
    /// The JSON the statement carries: serde's, in field order.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a certificate serialises")
    }

    /// node-verdict's status for a gpuctl verdict.
    pub fn status_of(verdict: &str) -> &'static str {
        match verdict {
            "pass" => "PASS",
            "warn" => "WARNING",
            "fail" => "CRITICAL",
            _ => "UNKNOWN",
        }
    }
}

/// The evidence file name of a job's report.
pub fn evidence_file(job_id: &str) -> String {
    format!("{job_id}.report.pb")
}
