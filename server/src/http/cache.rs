//! Rendered responses of finished plans and sweeps, kept in memory: a finished job never
//! changes (only a DELETE removes it), so `GET /v1/plans/{id}` of a stored plan is answered
//! without touching SQLite or re-serializing the plan document. Bounded in bytes; when a new
//! entry would pass the bound the cache starts over (simple, and reads refill it).

use axum::body::Bytes;
use std::collections::HashMap;
use std::sync::Mutex;

pub struct Rendered {
    inner: Mutex<Entries>,
    limit: usize,
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
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &str) -> Option<Bytes> {
        self.lock().map.get(key).cloned()
    }

    pub fn put(&self, key: String, value: Bytes) {
        if value.len() > self.limit {
            return;
        }
        let mut e = self.lock();
        if e.bytes + value.len() > self.limit {
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
}
