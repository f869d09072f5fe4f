//! Registrations let in at a bounded rate (`--max-registrations-per-s`):
//! after a failover the whole fleet comes back to the new leader within
//! seconds, each agent's retries jittered but all of them at once. Past the
//! bound a registration is refused before it reaches the scheduler, naming
//! the bound, and its agent tries again after its backoff; no node is lost
//! for it while its agent's grace lasts. A generic cell rate (GCRA) of
//! nine tenths of the bound with a burst of the tenth left keeps any one
//! second's registrations at the bound or under.

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tonic::Status;

pub struct Registrations {
    per_s: u32,
    limiter: DefaultDirectRateLimiter,
}

impl Registrations {
    /// At most `per_s` registrations in any second (10 at least).
    pub fn new(per_s: u32) -> Registrations {
        let per_s = per_s.max(10);
        let burst = per_s / 10;
        let nz = |n: u32| NonZeroU32::new(n).expect("at least 1 with per_s >= 10");
        Registrations {
            per_s,
            limiter: RateLimiter::direct(
                Quota::per_second(nz(per_s - burst)).allow_burst(nz(burst)),
            ),
        }
    }

    /// One registration, or the refusal its agent sees.
    pub fn admit(&self) -> Result<(), Status> {
        self.limiter.check().map_err(|_| {
            Status::resource_exhausted(format!(
                "the coordinator takes at most {} registrations a second (--max-registrations-per-s), so that a fleet coming back at once does not swamp it; the agent tries again after its backoff",
                self.per_s
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_once_only_the_burst_is_let_in_and_the_refusal_names_the_bound() {
        let r = Registrations::new(1_000);
        let t0 = std::time::Instant::now();
        let admitted = (0..5_000).filter(|_| r.admit().is_ok()).count();
        // The burst (100), and what refilled while the loop ran (900/s).
        let refilled = (900.0 * t0.elapsed().as_secs_f64()).ceil() as usize;
        assert!(
            (100..=101 + refilled).contains(&admitted),
            "{admitted} let in, {refilled} refilled"
        );
        let e = r.admit().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(
            e.message().contains("at most 1000 registrations a second"),
            "{e}"
        );
        assert!(e.message().contains("--max-registrations-per-s"), "{e}");
    }
}
