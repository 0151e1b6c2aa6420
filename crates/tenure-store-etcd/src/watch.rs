//! Holder changes pushed from an etcd watch on the holder keys.

use etcd_client::{Client, EventType, WatchOptions};
use tenure_lease::{FencingToken, LeaseRecord, StoreError, WatchEvent, WatchReceiver};
use tokio::sync::mpsc;

use crate::error::etcd_error;
use crate::layout::{GrantValue, Layout};

/// Events buffered for a slow subscriber before the watch blocks.
const BUFFER: usize = 1024;

/// Watches the holder keys of the leases whose names start with `prefix`, from now on:
/// a created key is [`WatchEvent::Granted`] (a rewrite by its holder is not reported), a
/// deleted one [`WatchEvent::Ended`]. The receiver ends when the watch breaks.
pub(crate) async fn watch(
    client: &Client,
    layout: &Layout,
    prefix: &str,
) -> Result<WatchReceiver, StoreError> {
    let from = layout.lease(prefix);
    let mut stream = client
        .watch_client()
        .watch(from.clone(), Some(WatchOptions::new().with_prefix()))
        .await
        .map_err(|e| etcd_error("watch", &from, e))?;
    // Wait for the server to confirm the watch: events from then on are delivered.
    match stream.message().await {
        Ok(Some(resp)) if resp.created() && !resp.canceled() => {}
        Ok(other) => {
            return Err(StoreError::unavailable(
                "etcd",
                format!("watch {from}: not created: {other:?}"),
            ));
        }
        Err(e) => return Err(etcd_error("watch", &from, e)),
    }
    let (tx, rx) = mpsc::channel(BUFFER);
    let layout = layout.clone();
    tokio::spawn(async move {
        loop {
            let resp = tokio::select! {
                _ = tx.closed() => return,
                m = stream.message() => match m {
                    Ok(Some(resp)) if !resp.canceled() => resp,
                    _ => return, // broken: the receiver sees the end
                },
            };
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let Some(name) = layout.name_of(kv.key()) else {
                    continue;
                };
                let event = match ev.event_type() {
                    EventType::Delete => WatchEvent::Ended {
                        name: name.to_string(),
                    },
                    EventType::Put if kv.version() == 1 => {
                        let Ok(v) = GrantValue::decode(kv.key(), kv.value()) else {
                            continue;
                        };
                        WatchEvent::Granted(LeaseRecord {
                            name: name.to_string(),
                            owner: v.owner,
                            instance: v.instance,
                            token: FencingToken::new(kv.create_revision() as u64),
                            expires_in: std::time::Duration::from_millis(v.ttl_ms),
                            version: 1,
                            note: v.note,
                            ..LeaseRecord::default()
                        })
                    }
                    EventType::Put => continue,
                };
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}
