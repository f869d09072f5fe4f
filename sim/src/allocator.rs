//! The simulator's allocator (mimalloc, v3) kept from giving freed pages
//! back to the OS. Each short job at 16,384 nodes × 8 GPUs frees the memory
//! of its 131,072 simulated ranks and the next job takes as much again:
//! given back after mimalloc's 1 s, it came back as page faults, each page
//! zeroed by the kernel (`clear_page_erms`, 17-19 % of the simulator's CPU
//! in `perf`), on the two cores the coordinator and the CLI's calls share.
//! Kept, the simulator's peak stays where it was (~5.4 GB; the OS gets it
//! back at exit), and what it no longer zeroes is left to the coordinator
//! (docs/benchmarks.md, "The simulator keeps its freed pages").

use std::os::raw::{c_int, c_long};

/// `mi_option_purge_delay` in mimalloc v3's `mimalloc.h` (`mi_option_e`);
/// libmimalloc-sys names no constant for it.
const PURGE_DELAY: c_int = 15;
/// mimalloc v3's default for it (ms): read first, so that an index that
/// meant another option is found out rather than set.
const V3_DEFAULT_MS: c_long = 1000;
/// The environment's say over the option, which is left to it.
const ENV: &str = "MIMALLOC_PURGE_DELAY";

/// Sets mimalloc never to purge freed pages, unless [`ENV`] says otherwise.
/// `Err` says why it was not set.
pub fn keep_freed_pages() -> Result<(), String> {
    if let Ok(v) = std::env::var(ENV) {
        return Err(format!("{ENV}={v} is set: the environment's value stands"));
    }
    // SAFETY: plain reads and writes of mimalloc's option table, which
    // mimalloc itself makes safe to call from any thread at any time.
    let now = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
    if now != V3_DEFAULT_MS {
        return Err(format!(
            "mimalloc option {PURGE_DELAY} reads {now}, not the purge delay's default {V3_DEFAULT_MS}: not set"
        ));
    }
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_is_found_and_turned_off() {
        assert!(
            std::env::var(ENV).is_err(),
            "{ENV} is set in this test's environment: unset it"
        );
        keep_freed_pages().unwrap();
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) }, -1);
        // Set once, the option no longer reads the default: a second call
        // says so and changes nothing.
        assert!(keep_freed_pages().unwrap_err().contains("reads -1"));
    }
}
