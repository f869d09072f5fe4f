//! Who may call what, the parts every process agrees on: the metadata that
//! carries a CLI token and a worker's secret, and the per-rank worker secrets
//! themselves (HMAC-SHA256 of `job/attempt/rank` under a key only the
//! coordinator holds, so it hands them out and checks them without storing
//! one per rank, and a restarted or standby coordinator reading the same key
//! from the store derives the same ones).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Where the CLI's token goes: `authorization: Bearer TOKEN`.
pub const AUTHORIZATION: &str = "authorization";
/// Where a worker's secret goes on every WorkerService call.
pub const RANK_SECRET: &str = "x-gpuctl-rank-secret";
/// The environment variable the agent hands a worker its secret in.
pub const RANK_SECRET_ENV: &str = "GPUCTL_RANK_SECRET";
/// A node certificate's role: a URI subject alternative name
/// `urn:gpuctl:node:NAME` that `gpuctl certs init` puts in each node's
/// certificate and in no other. A certificate merely *named* like a node
/// (the operator's, say) is not a node's identity.
pub const NODE_URI_PREFIX: &str = "urn:gpuctl:node:";

/// The bytes of a [`RankKey`].
pub const KEY_BYTES: usize = 32;

/// The coordinator's key for worker secrets.
#[derive(Clone)]
pub struct RankKey([u8; KEY_BYTES]);

impl std::fmt::Debug for RankKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RankKey(..)")
    }
}

impl RankKey {
    /// A new random key from the operating system.
    pub fn generate() -> Result<RankKey, getrandom::Error> {
        let mut key = [0u8; KEY_BYTES];
        getrandom::fill(&mut key)?;
        Ok(RankKey(key))
    }

    /// A stored key; `None` unless it has exactly [`KEY_BYTES`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<RankKey> {
        Some(RankKey(bytes.try_into().ok()?))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The secret of one rank of one job attempt: `r{rank}-{hex}`. The rank
    /// is in the clear so that a call that names no rank (a rendezvous read)
    /// can still be checked against the rank whose secret it carries.
    pub fn secret(&self, job: &str, attempt: u32, rank: u32) -> String {
        self.secrets(job, attempt).of(rank)
    }

    /// The secrets of one job attempt's ranks, keyed once: a job's start
    /// hands out every one of them, 32,768 at 4,096 nodes.
    pub fn secrets(&self, job: &str, attempt: u32) -> JobSecrets {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(format!("{job}/{attempt}/").as_bytes());
        JobSecrets(mac)
    }

    /// The rank whose secret `presented` is for this job attempt, or `None`
    /// when it is no secret of this job attempt. Compared in constant time.
    pub fn verify(&self, job: &str, attempt: u32, presented: &str) -> Option<u32> {
        let (rank, _) = presented.strip_prefix('r')?.split_once('-')?;
        let rank: u32 = rank.parse().ok()?;
        let want = self.secret(job, attempt, rank);
        bool::from(want.as_bytes().ct_eq(presented.as_bytes())).then_some(rank)
    }
}

/// [`RankKey::secrets`]: the MAC state after the key and `job/attempt/`.
pub struct JobSecrets(Hmac<Sha256>);

impl JobSecrets {
    /// `r{rank}-{hex of HMAC-SHA256(key, job/attempt/rank)}`.
    pub fn of(&self, rank: u32) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut mac = self.0.clone();
        mac.update(rank.to_string().as_bytes());
        let tag = mac.finalize().into_bytes();
        let mut s = format!("r{rank}-");
        s.reserve(2 * tag.len());
        for b in tag {
            s.push(HEX[usize::from(b >> 4)] as char);
            s.push(HEX[usize::from(b & 15)] as char);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_verifies_for_its_own_job_attempt_and_rank_only() {
        let key = RankKey::generate().unwrap();
        let s = key.secret("job-000001", 1, 3);
        assert!(s.starts_with("r3-"), "{s}");
        assert_eq!(key.verify("job-000001", 1, &s), Some(3));
        assert_eq!(key.verify("job-000002", 1, &s), None);
        assert_eq!(key.verify("job-000001", 2, &s), None);
        // Another rank number in front of rank 3's MAC.
        let forged = s.replacen("r3-", "r4-", 1);
        assert_eq!(key.verify("job-000001", 1, &forged), None);
        for junk in ["", "r", "r3", "r3-", "x3-00", "r-1-00"] {
            assert_eq!(key.verify("job-000001", 1, junk), None, "{junk:?}");
        }
        // Another key (another coordinator's store) derives other secrets;
        // the same key bytes derive the same ones.
        let other = RankKey::generate().unwrap();
        assert_eq!(other.verify("job-000001", 1, &s), None);
        let same = RankKey::from_bytes(key.as_bytes()).unwrap();
        assert_eq!(same.secret("job-000001", 1, 3), s);
        assert!(RankKey::from_bytes(&[0; 31]).is_none());
    }

    #[test]
    fn secrets_are_hmac_sha256_of_job_attempt_rank_in_hex() {
        // Python: hmac.new(bytes(32), b"job-000001/1/3", hashlib.sha256).hexdigest()
        let key = RankKey::from_bytes(&[0; KEY_BYTES]).unwrap();
        assert_eq!(
            key.secret("job-000001", 1, 3),
            "r3-263fd1d62add1e542606eb18052a25e88eebca8d793426ff6b7c22b41f9bc0ec"
        );
        let all = key.secrets("job-000001", 1);
        assert_eq!(all.of(3), key.secret("job-000001", 1, 3));
        assert_ne!(all.of(30), key.secret("job-000001", 1, 3));
    }
}
