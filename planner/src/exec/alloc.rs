//! A counting global allocator: the process's real heap in use and its peak, so that the
//! executor can report what the kernels' temporaries add to the live tensors it accounts for.
//!
//! A library cannot choose the global allocator; the binary installs it:
//! `#[global_allocator] static A: remat_planner::exec::alloc::Counting = remat_planner::exec::alloc::Counting;`
//! Without it, [`installed`] is false and reports say the heap was not measured.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting bytes in use and their peak.
pub struct Counting;

#[inline]
fn grow(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call forwards to `System` with the same arguments; the counters are only
// statistics and never influence the allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            INSTALLED.store(true, Ordering::Relaxed);
            grow(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            INSTALLED.store(true, Ordering::Relaxed);
            grow(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                grow(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

/// Whether the counting allocator is the process's global allocator.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Heap bytes in use now (all threads).
pub fn current() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// The peak since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Restarts the peak from the bytes in use now; returns them.
pub fn reset_peak() -> usize {
    let now = current();
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// Asks the C allocator to keep freed memory for reuse instead of handing it back to the
/// kernel: blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap rather
/// than from fresh mappings, and the heap is not trimmed. A training step frees and
/// reallocates the same tensor sizes over and over; on this project's 2-core VM every fresh
/// page costs a fault of 1-10 µs, about 30k of them per resnet18 step. Process-wide, once;
/// a no-op outside glibc. The counted heap (what reports show) is unaffected.
pub fn reuse_freed_pages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes glibc's allocation thresholds; it takes plain ints
        // and is safe to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    });
}
