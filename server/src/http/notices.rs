//! Deletions made on other replicas (PostgreSQL): each replica `LISTEN`s on `remat_deleted`,
//! where a `DELETE` of a job notifies its cache key when it commits, and drops that response
//! from its cache. While the listener is connected the cache answers stored plans without a
//! round trip to the database; while it is not (the database restarting, the connection lost),
//! the cache is emptied and every cached answer is checked against the database first.

use super::cache::Rendered;
use super::store::{redact, PgStore, DELETED_CHANNEL};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::AsyncMessage;

/// Follows deletions until the runtime stops; reconnects every second while it cannot.
pub async fn follow(store: PgStore, rendered: Arc<Rendered>) {
    let mut complained = false;
    loop {
        match listen(&store, &rendered).await {
            Ok(()) => complained = false,
            Err(e) => {
                if !complained {
                    tracing::warn!(db = %redact(store.url()), error = %e, "cannot follow deletions; cached plans are checked against the database until it can");
                    complained = true;
                }
            }
        }
        rendered.set_trusted(false);
        rendered.clear();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One connection's worth: `LISTEN`, then invalidate what is notified until it drops.
async fn listen(store: &PgStore, rendered: &Rendered) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) =
        tokio_postgres::connect(store.url(), tokio_postgres::NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n.payload().to_string()).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    let listening = client
        .batch_execute(&format!("LISTEN {DELETED_CHANNEL}"))
        .await;
    if listening.is_ok() {
        // Anything cached so far may have been deleted unheard.
        rendered.clear();
        rendered.set_trusted(true);
        tracing::info!(
            "following deletions: cached plans are answered without asking the database"
        );
        while let Some(key) = rx.recv().await {
            rendered.invalidate(&key);
        }
        tracing::warn!("lost the connection that follows deletions; reconnecting");
    }
    driver.abort();
    listening
}
