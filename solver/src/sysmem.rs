//! What the machine has: the memory a new allocation can get, for the solver to decide what
//! it may build (the MILP) and for the executor what it may run.

/// Bytes of memory a new allocation of this process can get, where the system says: Linux's
/// `MemAvailable`, and, inside a cgroup (v2) with a memory limit, no more than that limit less
/// what the cgroup uses. `None` where neither is known (other systems).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let system = meminfo.as_deref().and_then(mem_available);
    let read =
        |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .map(|max| max.saturating_sub(read("/sys/fs/cgroup/memory.current").unwrap_or(0)));
    match (system, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(super::mem_available(text), Some(20_000_000 * 1024));
        assert_eq!(super::mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(super::mem_available("MemAvailable: lots\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_says_what_is_available() {
        let a = super::available_memory().expect("/proc/meminfo");
        assert!(a > 0);
    }
}
