//! What the other processes on the database tell this replica (PostgreSQL `LISTEN`, one
//! connection per replica):
//! - deletions, on `remat_deleted`: a `DELETE` of a job (or a validation replacing its
//!   document) notifies its cache key when it commits, and this replica drops that response from
//!   its cache. While the listener is connected the cache answers stored plans without a round
//!   trip to the database; while it is not (the database restarting, the connection lost), the
//!   cache is emptied and every cached answer is checked against the database first.
//! - ends, on `remat_finished`: a worker's last write of a job (done or failed) notifies its key
//!   when it commits. Requests waiting for that job (`submit::poll_for`) hear it at once, where
//!   they would otherwise see it only at their next look at the database; a deletion wakes them
//!   too. The looks go on, less often, for what the listener misses while it reconnects.

use super::cache::Rendered;
use super::store::{redact, PgStore, DELETED_CHANNEL, FINISHED_CHANNEL};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_postgres::AsyncMessage;

/// The keys (`<kind>/<id>`) of jobs that ended (finished, failed or were deleted), as heard.
pub struct Ended {
    tx: broadcast::Sender<String>,
}

impl Ended {
    pub fn new() -> Ended {
        // A waiter that falls this far behind is told it may have missed its job (`Lagged`).
        Ended {
            tx: broadcast::channel(1024).0,
        }
    }

    /// Subscribe before the first look at the job's status, so that an end heard between the
    /// look and the wait is not missed.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.tx.subscribe()
    }

    fn heard(&self, key: String) {
        // No receiver: nobody is waiting.
        let _ = self.tx.send(key);
    }

    /// Returns when `key` is heard on `rx`, or when ends were missed (this waiter fell behind),
    /// one of which may have been it; never, once nothing can be heard any more.
    pub async fn of(rx: &mut broadcast::Receiver<String>, key: &str) {
        loop {
            match rx.recv().await {
                Ok(heard) if heard == key => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    }
}

/// Follows deletions and ends until the runtime stops; reconnects every second while it cannot.
pub async fn follow(store: PgStore, rendered: Arc<Rendered>, ended: Arc<Ended>) {
    let mut complained = false;
    loop {
        match listen(&store, &rendered, &ended).await {
            Ok(()) => complained = false,
            Err(e) => {
                if !complained {
                    tracing::warn!(db = %redact(store.url()), error = %e, "cannot follow deletions and job ends; cached plans are checked against the database, and waiting posts look at it, until it can");
                    complained = true;
                }
            }
        }
        rendered.set_trusted(false);
        rendered.clear();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One connection's worth: `LISTEN`, then act on what is notified until it drops.
async fn listen(
    store: &PgStore,
    rendered: &Rendered,
    ended: &Ended,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = store.connect().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let deleted = n.channel() == DELETED_CHANNEL;
                    if tx.send((deleted, n.payload().to_string())).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    let listening = client
        .batch_execute(&format!(
            "LISTEN {DELETED_CHANNEL}; LISTEN {FINISHED_CHANNEL}"
        ))
        .await;
    if listening.is_ok() {
        // Anything cached so far may have been deleted unheard.
        rendered.clear();
        rendered.set_trusted(true);
        tracing::info!(
            "following deletions: cached plans are answered without asking the database"
        );
        while let Some((deleted, key)) = rx.recv().await {
            if deleted {
                rendered.invalidate(&key);
            }
            ended.heard(key);
        }
        tracing::warn!("lost the connection that follows deletions and job ends; reconnecting");
    }
    driver.abort();
    listening
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_hears_its_own_job_and_no_other() {
        let ended = Ended::new();
        let mut rx = ended.subscribe();
        ended.heard("plan/other".into());
        ended.heard("plan/mine".into());
        tokio::time::timeout(Duration::from_secs(5), Ended::of(&mut rx, "plan/mine"))
            .await
            .expect("its own key is heard");
        ended.heard("plan/other".into());
        let wait = tokio::time::timeout(Duration::from_millis(50), Ended::of(&mut rx, "plan/mine"));
        assert!(
            wait.await.is_err(),
            "another job's end does not end the wait"
        );
    }

    #[tokio::test]
    async fn a_waiter_that_fell_behind_looks_again() {
        let ended = Ended::new();
        let mut rx = ended.subscribe();
        for i in 0..2000 {
            ended.heard(format!("plan/{i}"));
        }
        tokio::time::timeout(Duration::from_secs(5), Ended::of(&mut rx, "plan/mine"))
            .await
            .expect("a waiter that missed ends returns, to look at the database");
    }
}
