//! Rendered responses of finished plans and sweeps, kept in memory: a finished job never
//! changes (only a DELETE removes it), so `GET /v1/plans/{id}` of a stored plan is answered
//! without touching SQLite or re-serializing the plan document. Bounded in bytes; when a new
//! entry would pass the bound the cache starts over (simple, and reads refill it).
//!
//! On PostgreSQL another replica may delete a job: the cache is *trusted* (answers without
//! asking the database) only while this replica hears of every deletion (`notices.rs`); a
//! deletion heard bumps the generation, so a response read from the database before it is not
//! cached after it.
//!
//! A miss is filled once: the first reader of a missing entry reads the store (a [`Fill::Lead`]),
//! readers of the same entry meanwhile wait for it ([`Fill::Follow`]) and look again. A replica
//! that starts, or clears its cache, under load would otherwise send the store one query per
//! request of a popular plan (200 readers: 200 queries for the same row, queued on the pool).

use axum::body::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::watch;

pub struct Rendered {
    inner: Mutex<Entries>,
    limit: usize,
    generation: AtomicU64,
    trusted: AtomicBool,
    /// Fills in progress: the receiving end of each leader's channel, closed when it ends.
    flights: Mutex<HashMap<String, watch::Receiver<()>>>,
}

/// Who reads a missing entry from the store.
pub enum Fill<'a> {
    /// This reader: it holds the guard until it has read (and maybe cached) the entry.
    Lead(FillGuard<'a>),
    /// Another reader is at it: wait with [`Fill::wait`], then look in the cache again (the
    /// entry may still be missing: not finished, not found, or the leader gave up).
    Follow(watch::Receiver<()>),
}

impl Fill<'_> {
    /// Waits until the leader's fill ends (however it ends).
    pub async fn wait(rx: &mut watch::Receiver<()>) {
        // Nothing is ever sent: `changed` returns when the leader's guard drops the sender.
        let _ = rx.changed().await;
    }
}

/// Held by the reader filling an entry; dropping it (done, failed or cancelled) releases the
/// readers waiting on it.
pub struct FillGuard<'a> {
    cache: &'a Rendered,
    key: String,
    _done: watch::Sender<()>,
}

impl Drop for FillGuard<'_> {
    fn drop(&mut self) {
        // Out of the map first, so that a reader arriving now starts a fill of its own rather
        // than waiting on one that has ended; the sender drops after this and wakes the others.
        self.cache.flights().remove(&self.key);
    }
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
            flights: Mutex::new(HashMap::new()),
        }
    }

    fn flights(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<()>>> {
        self.flights.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the fill of `key` in progress, or leads a new one.
    pub fn fill(&self, key: &str) -> Fill<'_> {
        let mut flights = self.flights();
        if let Some(rx) = flights.get(key) {
            return Fill::Follow(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        flights.insert(key.to_string(), rx);
        Fill::Lead(FillGuard {
            cache: self,
            key: key.to_string(),
            _done: tx,
        })
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

    #[tokio::test]
    async fn one_reader_fills_a_missing_entry_and_the_others_wait_for_it() {
        let c = Rendered::new(100);
        let Fill::Lead(guard) = c.fill("plan/x") else {
            panic!("the first reader leads");
        };
        let Fill::Follow(mut rx) = c.fill("plan/x") else {
            panic!("a second reader follows");
        };
        assert!(
            matches!(c.fill("plan/y"), Fill::Lead(_)),
            "another key has its own fill"
        );
        let waiting = tokio::spawn(async move {
            Fill::wait(&mut rx).await;
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the follower waits while the leader reads"
        );
        c.put("plan/x".into(), Bytes::from_static(b"plan"));
        drop(guard);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the follower is released when the leader ends")
            .unwrap();
        assert!(
            matches!(c.fill("plan/x"), Fill::Lead(_)),
            "an ended fill is gone: the next miss leads again"
        );
    }

    #[tokio::test]
    async fn a_leader_that_gives_up_releases_its_followers() {
        let c = Rendered::new(100);
        let lead = c.fill("plan/x");
        let Fill::Follow(mut rx) = c.fill("plan/x") else {
            panic!("a second reader follows");
        };
        drop(lead);
        tokio::time::timeout(std::time::Duration::from_secs(5), Fill::wait(&mut rx))
            .await
            .expect("released though nothing was cached");
        assert!(c.get("plan/x").is_none());
    }
}
