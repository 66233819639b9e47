//! A counting global allocator: the heap a measured run uses and its peak, so that the
//! executor can report what the kernels' temporaries add to the live tensors it accounts for.
//!
//! A library cannot choose the global allocator; the binary installs it:
//! `#[global_allocator] static A: remat_exec::Counting = remat_exec::Counting;`
//! Without it, [`installed`] is false and reports say the heap was not measured.
//!
//! Only a run's own allocations count: those made on *measured threads* (the executor's
//! thread pool, where a run and its kernels' parallel work execute) while a [`Measurement`] is
//! open. A process that does other work at the same time (the service's
//! other jobs and uploads, the test harness's other tests) allocates on other threads and is
//! not counted; before this, such work showed up as megabytes of heap that "outlived" a step.
//! One measurement is open at a time in a process ([`Measurement::begin`] waits for the
//! previous one to end), so two runs never count into the same figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Bytes allocated less bytes freed on measured threads since the open measurement began.
static CURRENT: AtomicIsize = AtomicIsize::new(0);
/// The highest `CURRENT` since the last reset.
static PEAK: AtomicIsize = AtomicIsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Held by the open measurement.
static MEASURING: Mutex<()> = Mutex::new(());

thread_local! {
    // A const-initialized `Cell<bool>` has no destructor and needs no lazy initialization,
    // so the allocator may read it at any point of a thread's life without allocating.
    static MEASURED: Cell<bool> = const { Cell::new(false) };
}

/// The system allocator, counting the bytes measured threads have in use and their peak.
pub struct Counting;

#[inline]
fn on_measured_thread() -> bool {
    MEASURED.try_with(Cell::get).unwrap_or(false)
}

#[inline]
fn grow(n: usize) {
    INSTALLED.store(true, Ordering::Relaxed);
    if on_measured_thread() {
        let n = n as isize;
        let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

#[inline]
fn shrink(n: usize) {
    if on_measured_thread() {
        CURRENT.fetch_sub(n as isize, Ordering::Relaxed);
    }
}

// SAFETY: every call forwards to `System` with the same arguments; the counters are only
// statistics and never influence the allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        shrink(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                grow(new_size - layout.size());
            } else {
                shrink(layout.size() - new_size);
            }
        }
        p
    }
}

/// Whether the counting allocator is the process's global allocator.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Makes this thread's allocations count (or not) toward the open measurement: the
/// executor's pool threads are marked when they start.
pub(crate) fn mark_thread(measured: bool) {
    MEASURED.with(|m| m.set(measured));
}

/// The open measurement of one run: while it lives no other can begin, and [`current`]
/// and [`peak`] count from zero at its beginning. Memory a measured thread frees that was
/// allocated before (or elsewhere) counts negative, so the figures are signed.
///
/// [`current`]: Measurement::current
/// [`peak`]: Measurement::peak
pub struct Measurement {
    _open: MutexGuard<'static, ()>,
}

impl Measurement {
    /// Waits for the open measurement to end, then opens one at zero bytes.
    pub fn begin() -> Self {
        let open = MEASURING.lock().unwrap_or_else(PoisonError::into_inner);
        CURRENT.store(0, Ordering::Relaxed);
        PEAK.store(0, Ordering::Relaxed);
        Measurement { _open: open }
    }

    /// Bytes the measured threads hold now, net of what they freed, since the beginning.
    pub fn current(&self) -> i64 {
        CURRENT.load(Ordering::Relaxed) as i64
    }

    /// The peak of [`Measurement::current`] since the last [`Measurement::reset_peak`].
    pub fn peak(&self) -> i64 {
        PEAK.load(Ordering::Relaxed) as i64
    }

    /// Restarts the peak from the bytes held now; returns them.
    pub fn reset_peak(&self) -> i64 {
        let now = CURRENT.load(Ordering::Relaxed);
        PEAK.store(now, Ordering::Relaxed);
        now as i64
    }
}

/// Asks the C allocator to keep freed memory for reuse instead of handing it back to the
/// kernel. A training step frees and reallocates the same tensor sizes over and over, and
/// every fresh page costs a fault (docs/bench/executor.md, "Freed pages kept for reuse"):
/// - blocks of any size up to 2 GiB come from the heap rather than from fresh mappings
///   (`M_MMAP_THRESHOLD`; where glibc refuses that, its 32 MiB ceiling), and the heap is not
///   trimmed after each free (`M_TRIM_THRESHOLD`);
/// - every thread allocates from the one main heap (`M_ARENA_MAX` 1). A thread's own arena
///   is a chain of 64 MiB mappings, so a larger block on the executor's pool threads (VGG-11's
///   411 MB weight gradient) was mapped fresh and faulted in page by page on every step,
///   whatever the thresholds: its store-all step measured 0.6–2.1 s from one run to the next
///   and a plan's overhead anywhere from −70% to +116% (docs/cost-model.md, "The reference").
///
/// Process-wide and once; a no-op outside glibc. glibc fixes its arena count when the
/// second thread first allocates, so a binary calls this first thing in `main` (the `remat`
/// binary does); the executor calls it too, where it still sets the thresholds. The counted
/// heap (what reports show) is unaffected. [`return_freed_pages`] gives the memory back once
/// the executor is done.
pub fn reuse_freed_pages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes glibc's allocation parameters; it takes plain ints
        // and is safe to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            if libc::mallopt(libc::M_MMAP_THRESHOLD, i32::MAX) == 0 {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            }
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    });
}

/// Hands the heap's free pages back to the kernel (glibc's `malloc_trim`): with
/// [`reuse_freed_pages`] nothing is trimmed on its own, so a long-lived process (the service)
/// calls this when an executor is dropped, and a validation's peak does not stay resident.
/// A no-op outside glibc.
pub fn return_freed_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of glibc's heaps; safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub use remat_solver::sysmem::available_memory;
