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
        format!("r{rank}-{}", hex(&self.mac(job, attempt, rank)))
    }

    /// The rank whose secret `presented` is for this job attempt, or `None`
    /// when it is no secret of this job attempt. Compared in constant time.
    pub fn verify(&self, job: &str, attempt: u32, presented: &str) -> Option<u32> {
        let (rank, _) = presented.strip_prefix('r')?.split_once('-')?;
        let rank: u32 = rank.parse().ok()?;
        let want = self.secret(job, attempt, rank);
        bool::from(want.as_bytes().ct_eq(presented.as_bytes())).then_some(rank)
    }

    fn mac(&self, job: &str, attempt: u32, rank: u32) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(format!("{job}/{attempt}/{rank}").as_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
}
