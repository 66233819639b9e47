//! Rendered responses of finished plans and sweeps, kept in memory: a finished job never
//! changes (only a DELETE removes it), so `GET /v1/plans/{id}` of a stored plan is answered
//! without touching SQLite or re-serializing the plan document. Bounded in bytes; when a new
//! entry would pass the bound the cache starts over (simple, and reads refill it).
//!
//! On PostgreSQL another replica may delete a job: the cache is *trusted* (answers without
//! asking the database) only while this replica hears of every deletion (`deletions.rs`); a
//! deletion heard bumps the generation, so a response read from the database before it is not
//! cached after it.

use axum::body::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub struct Rendered {
    inner: Mutex<Entries>,
    limit: usize,
    generation: AtomicU64,
    trusted: AtomicBool,
}

#[derive(Default)]
struct Entries {
    map: HashMap<String, Bytes>,
    bytes: usize,
}

impl Rendered {
    pub fn new(limit: usize) -> Rendered {
        Rendered {
            inner: Mutex::new(Entries::default()),
            limit,
            generation: AtomicU64::new(0),
            trusted: AtomicBool::new(false),
        }
    }

    /// Bumped by every invalidation: read it before reading the store, pass it to
    /// [`Rendered::put_if`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Whether every deletion elsewhere reaches this cache (PostgreSQL: the listener is up).
    pub fn trusted(&self) -> bool {
        self.trusted.load(Ordering::SeqCst)
    }

    pub fn set_trusted(&self, trusted: bool) {
        self.trusted.store(trusted, Ordering::SeqCst);
    }

    /// Caches `value` unless something was invalidated since `generation` was read.
    pub fn put_if(&self, generation: u64, key: String, value: Bytes) {
        let mut e = self.lock();
        if self.generation() == generation {
            Self::insert(&mut e, self.limit, key, value);
        }
    }

    /// Removes `key` (a job deleted, here or on another replica).
    pub fn invalidate(&self, key: &str) {
        let mut e = self.lock();
        self.generation.fetch_add(1, Ordering::SeqCst);
        if let Some(old) = e.map.remove(key) {
            e.bytes -= old.len();
        }
    }

    /// Drops every entry (deletions may have been missed).
    pub fn clear(&self) {
        let mut e = self.lock();
        self.generation.fetch_add(1, Ordering::SeqCst);
        e.map.clear();
        e.bytes = 0;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &str) -> Option<Bytes> {
        self.lock().map.get(key).cloned()
    }

    pub fn put(&self, key: String, value: Bytes) {
        let mut e = self.lock();
        Self::insert(&mut e, self.limit, key, value);
    }

    fn insert(e: &mut Entries, limit: usize, key: String, value: Bytes) {
        if value.len() > limit {
            return;
        }
        if e.bytes + value.len() > limit {
            e.map.clear();
            e.bytes = 0;
        }
        e.bytes += value.len();
        if let Some(old) = e.map.insert(key, value) {
            e.bytes -= old.len();
        }
    }

    pub fn remove(&self, key: &str) {
        let mut e = self.lock();
        if let Some(old) = e.map.remove(key) {
            e.bytes -= old.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_in_bytes() {
        let c = Rendered::new(10);
        c.put("a".into(), Bytes::from_static(b"123456"));
        assert_eq!(c.get("a").as_deref(), Some(&b"123456"[..]));
        c.put("b".into(), Bytes::from_static(b"1234"));
        assert!(c.get("a").is_some() && c.get("b").is_some());
        c.put("c".into(), Bytes::from_static(b"12"));
        assert!(c.get("a").is_none() && c.get("b").is_none());
        assert!(c.get("c").is_some());
        c.put("big".into(), Bytes::from_static(b"12345678901"));
        assert!(c.get("big").is_none());
        c.remove("c");
        assert!(c.get("c").is_none());
    }

    #[test]
    fn a_response_read_before_an_invalidation_is_not_cached_after_it() {
        let c = Rendered::new(100);
        let before = c.generation();
        c.invalidate("plan/x");
        c.put_if(before, "plan/x".into(), Bytes::from_static(b"old"));
        assert!(c.get("plan/x").is_none());
        let now = c.generation();
        c.put_if(now, "plan/x".into(), Bytes::from_static(b"new"));
        assert_eq!(c.get("plan/x").as_deref(), Some(&b"new"[..]));
        c.clear();
        assert!(c.get("plan/x").is_none());
        assert!(!c.trusted());
    }
}
