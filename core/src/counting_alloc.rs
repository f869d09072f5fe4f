//! An allocator that counts the bytes live, for the tests that measure what
//! a connection or a waiting call holds (`core/tests/connection_memory.rs`,
//! `coordinator/tests/gate_memory.rs`). A test binary makes it its global
//! allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: gpuctl_core::counting_alloc::Counting = gpuctl_core::counting_alloc::Counting;
//! ```
//!
//! and reads [`live`] before and after. No binary of gpuctl uses it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, with a count beside it.
pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// Bytes allocated and not yet freed, as asked for (not the allocator's
/// size classes).
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every call is passed to the system allocator unchanged; only a count is kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
