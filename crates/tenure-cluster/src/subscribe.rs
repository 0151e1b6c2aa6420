//! Delivery of [`ClusterEvent`]s to subscribers, and the hand-over guard of a leave.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::member::ClusterEvent;

/// Where a node delivers cluster events: called in event order, must not block. Returns
/// `false` once the subscriber is gone (it is then dropped).
#[derive(Clone)]
pub struct ClusterSubscriber(Arc<dyn Fn(ClusterEvent) -> bool + Send + Sync>);

impl std::fmt::Debug for ClusterSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSubscriber")
    }
}

impl ClusterSubscriber {
    /// Events to a closure (return `false` to unsubscribe).
    pub fn new(f: impl Fn(ClusterEvent) -> bool + Send + Sync + 'static) -> Self {
        ClusterSubscriber(Arc::new(f))
    }

    /// Events as messages to a local actor; unsubscribes when the actor has stopped.
    pub fn to_actor<M>(actor: ractor::ActorRef<M>) -> Self
    where
        M: ractor::Message + From<ClusterEvent>,
    {
        ClusterSubscriber::new(move |event| actor.cast(M::from(event)).is_ok())
    }

    /// Events into a channel (for plain async code and tests).
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<ClusterEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ClusterSubscriber::new(move |e| tx.send(e).is_ok()), rx)
    }

    /// Hands `event` to the subscriber, as a node does with each of its cluster events (a
    /// test double of a node's events does the same); `false` once the subscriber is gone.
    pub fn deliver(&self, event: ClusterEvent) -> bool {
        (self.0)(event)
    }
}

/// Held by whoever hands over during a leave; the node proceeds (releases its member
/// lease) once every clone is dropped or `leave-timeout` passed.
#[derive(Debug, Clone)]
pub struct HandOver(#[allow(dead_code)] mpsc::Sender<()>);

/// Completes when every [`HandOver`] clone is dropped.
#[derive(Debug)]
pub struct HandOverWait(mpsc::Receiver<()>);

impl HandOver {
    /// A hand-over and the wait that completes once it and all its clones are dropped.
    pub fn new() -> (HandOver, HandOverWait) {
        let (tx, rx) = mpsc::channel(1);
        (HandOver(tx), HandOverWait(rx))
    }
}

impl HandOverWait {
    /// Waits until all guards are dropped.
    pub async fn done(mut self) {
        while self.0.recv().await.is_some() {}
    }
}
