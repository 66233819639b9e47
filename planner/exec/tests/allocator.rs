//! `alloc::reuse_freed_pages` and `alloc::return_freed_pages` on glibc, from a `main` that
//! runs before any other thread allocates (no test harness: glibc fixes its arena count when a
//! second thread first allocates, and the harness's threads would come first).
//!
//! A block larger than a thread arena's 64 MiB heaps, allocated on a thread that is not the
//! main one (as the executor's pool threads are), must come from the heap and stay there
//! when freed, and go back to the kernel on `return_freed_pages`.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    const BLOCK: usize = 200 << 20;
    remat_exec::alloc::reuse_freed_pages();
    let info = || {
        // SAFETY: mallinfo2 only reads glibc's statistics.
        unsafe { libc::mallinfo2() }
    };
    let (mapped_while_held, heap_while_held, heap_after_free) = std::thread::spawn(move || {
        // black_box: the compiler may otherwise leave out an allocation nothing observes.
        let block = std::hint::black_box(vec![1u8; BLOCK]);
        let held = info();
        drop(std::hint::black_box(block));
        let freed = info();
        (held.hblkhd, held.arena, freed.arena)
    })
    .join()
    .expect("the allocating thread");
    let mut failures = vec![];
    if mapped_while_held >= BLOCK {
        failures.push(format!(
            "a {BLOCK}-byte block on a pool-like thread was mapped fresh ({mapped_while_held} bytes \
             mapped): the thread did not share the main heap, or the mmap threshold was not raised"
        ));
    }
    if heap_while_held < BLOCK {
        failures.push(format!(
            "the heap held {heap_while_held} bytes with a {BLOCK}-byte block allocated on it"
        ));
    }
    if heap_after_free < BLOCK {
        failures.push(format!(
            "freeing the block trimmed the heap to {heap_after_free} bytes: freed pages were \
             not kept for reuse"
        ));
    }
    remat_exec::alloc::return_freed_pages();
    let heap_after_trim = info().arena;
    if heap_after_trim >= BLOCK {
        failures.push(format!(
            "return_freed_pages left {heap_after_trim} bytes of heap after the {BLOCK}-byte \
             block was freed"
        ));
    }
    if !failures.is_empty() {
        eprintln!("allocator: {}", failures.join("; "));
        std::process::exit(1);
    }
    println!(
        "allocator: a {BLOCK}-byte block on a second thread came from the main heap ({heap_while_held} \
         bytes), stayed there when freed ({heap_after_free}) and went back on return_freed_pages \
         ({heap_after_trim}): ok"
    );
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    // The settings are glibc's (mallopt); elsewhere both functions are documented no-ops.
    remat_exec::alloc::reuse_freed_pages();
    remat_exec::alloc::return_freed_pages();
    println!("allocator: not glibc, the functions are no-ops: nothing to check");
}
