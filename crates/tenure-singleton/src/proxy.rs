//! The singleton proxy: on every node, routes messages to the current instance of a
//! singleton (found through the cluster's pg group), buffering them in order while no
//! instance is known.

use std::collections::VecDeque;
use std::time::Duration;

use ractor::{
    Actor, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort, SupervisionEvent, pg,
};

use crate::manager::instance_group_prefix;

/// Why a proxy could not take or deliver a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The proxy's buffer, which keeps messages while no instance is known, was full: refused.
    #[error("singleton `{name}`: proxy buffer full ({capacity} messages waiting for an instance)")]
    BufferFull {
        /// The singleton's name.
        name: String,
        /// The buffer's capacity.
        capacity: usize,
    },
    /// No instance was found within the wait.
    #[error("singleton `{name}`: no instance found within {waited:?}")]
    NoInstance {
        /// The singleton's name.
        name: String,
        /// How long the proxy waited.
        waited: Duration,
    },
    /// A call reached no answer: timed out, or the instance stopped before answering.
    #[error("singleton `{name}`: the call was not answered: {detail}")]
    Call {
        /// The singleton's name.
        name: String,
        /// What happened.
        detail: String,
    },
    /// The proxy actor has stopped.
    #[error("singleton `{name}`: the proxy has stopped")]
    Stopped {
        /// The singleton's name.
        name: String,
    },
}

/// Messages of a proxy for instances with message type `M`.
pub enum ProxyMsg<M: ractor::Message> {
    Send(M, RpcReplyPort<Result<(), ProxyError>>),
    Instance(RpcReplyPort<Option<ActorRef<M>>>),
    /// Answered with the instance as soon as one is known (at once if it is).
    AwaitInstance(RpcReplyPort<ActorRef<M>>),
}

impl<M: ractor::Message> ractor::Message for ProxyMsg<M> {}

/// A handle to a proxy actor for singleton `name` whose instances take messages `M`.
pub struct SingletonProxy<M: ractor::Message> {
    name: String,
    actor: ActorRef<ProxyMsg<M>>,
}

impl<M: ractor::Message> Clone for SingletonProxy<M> {
    fn clone(&self) -> Self {
        SingletonProxy {
            name: self.name.clone(),
            actor: self.actor.clone(),
        }
    }
}

struct ProxyActor<M>(std::marker::PhantomData<fn() -> M>);

pub struct ProxyState<M: ractor::Message> {
    name: String,
    scope: String,
    /// Prefix of the instance groups (one per token).
    prefix: String,
    capacity: usize,
    instance: Option<ActorRef<M>>,
    buffer: VecDeque<M>,
    /// Callers waiting for an instance to be known.
    waiting: Vec<RpcReplyPort<ActorRef<M>>>,
}

impl<M: ractor::Message> SingletonProxy<M> {
    /// Starts a proxy for singleton `name` in the cluster's pg `scope`, buffering at most
    /// `capacity` messages while no instance is known.
    pub async fn start(scope: &str, name: &str, capacity: usize) -> Result<Self, ractor::SpawnErr> {
        let state = (scope.to_string(), name.to_string(), capacity);
        let (actor, _) =
            Actor::spawn(None, ProxyActor::<M>(std::marker::PhantomData), state).await?;
        Ok(SingletonProxy {
            name: name.to_string(),
            actor,
        })
    }

    /// Sends `msg` to the current instance, or buffers it (in order) until one is known.
    /// `Err(BufferFull)` when `capacity` messages are already waiting.
    pub async fn send(&self, msg: M) -> Result<(), ProxyError> {
        match self.actor.call(|r| ProxyMsg::Send(msg, r), None).await {
            Ok(ractor::rpc::CallResult::Success(result)) => result,
            _ => Err(ProxyError::Stopped {
                name: self.name.clone(),
            }),
        }
    }

    /// The singleton's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The instance known now, if any.
    pub async fn instance(&self) -> Option<ActorRef<M>> {
        match self.actor.call(ProxyMsg::Instance, None).await {
            Ok(ractor::rpc::CallResult::Success(instance)) => instance,
            _ => None,
        }
    }

    /// Calls the instance, waiting up to `timeout` for one to be known and to answer. A
    /// call goes straight to the instance: it may overtake messages still buffered by `send`.
    pub async fn call<R: Send + 'static>(
        &self,
        build: impl FnOnce(RpcReplyPort<R>) -> M,
        timeout: Duration,
    ) -> Result<R, ProxyError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let instance = match self
            .actor
            .call(ProxyMsg::AwaitInstance, Some(timeout))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(instance)) => instance,
            Ok(ractor::rpc::CallResult::Timeout) => {
                return Err(ProxyError::NoInstance {
                    name: self.name.clone(),
                    waited: timeout,
                });
            }
            _ => {
                return Err(ProxyError::Stopped {
                    name: self.name.clone(),
                });
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match instance
            .call(build, Some(left.max(Duration::from_millis(1))))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => Ok(r),
            Ok(ractor::rpc::CallResult::Timeout) => Err(ProxyError::Call {
                name: self.name.clone(),
                detail: "timed out".into(),
            }),
            Ok(_) => Err(ProxyError::Call {
                name: self.name.clone(),
                detail: "the instance stopped before answering".into(),
            }),
            Err(e) => Err(ProxyError::Call {
                name: self.name.clone(),
                detail: e.to_string(),
            }),
        }
    }

    /// Stops the proxy (buffered messages are dropped).
    pub fn stop(&self) {
        self.actor.stop(None);
    }
}

impl<M: ractor::Message> ProxyState<M> {
    fn refresh(&mut self) {
        // At most one instance runs (leases), but a departed one may linger in pg for a
        // while (a frozen node): take the instance of the highest token.
        let mut groups: Vec<String> = pg::which_scoped_groups(&self.scope)
            .into_iter()
            .filter(|g| g.starts_with(&self.prefix))
            .collect();
        groups.sort();
        self.instance = groups
            .iter()
            .rev()
            .find_map(|g| pg::get_scoped_members(&self.scope, g).into_iter().next())
            .map(ActorRef::from);
        self.flush();
        if let Some(instance) = &self.instance {
            for waiter in self.waiting.drain(..) {
                let _ = waiter.send(instance.clone());
            }
        }
    }

    fn flush(&mut self) {
        while let Some(instance) = &self.instance {
            let Some(msg) = self.buffer.pop_front() else {
                return;
            };
            match instance.cast(msg) {
                Ok(()) => {}
                Err(MessagingErr::SendErr(msg)) => {
                    // The instance is gone: keep the message (first in line) for the next one.
                    self.buffer.push_front(msg);
                    self.instance = None;
                }
                Err(e) => {
                    tracing::warn!(singleton = %self.name, error = %e, "message cannot be sent to the instance (a local-only variant to a remote instance?); dropped");
                }
            }
        }
    }
}

impl<M: ractor::Message> Actor for ProxyActor<M> {
    type Msg = ProxyMsg<M>;
    type State = ProxyState<M>;
    type Arguments = (String, String, usize);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (scope, name, capacity): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        pg::monitor_scope(scope.clone(), myself.get_cell());
        let mut state = ProxyState {
            prefix: instance_group_prefix(&name),
            name,
            scope,
            capacity,
            instance: None,
            buffer: VecDeque::new(),
            waiting: Vec::new(),
        };
        state.refresh();
        Ok(state)
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        pg::demonitor_scope(state.scope.clone(), myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ProxyMsg::Send(m, reply) => {
                if state.buffer.len() >= state.capacity {
                    let _ = reply.send(Err(ProxyError::BufferFull {
                        name: state.name.clone(),
                        capacity: state.capacity,
                    }));
                    return Ok(());
                }
                state.buffer.push_back(m);
                if state.instance.is_none() {
                    state.refresh();
                }
                state.flush();
                let _ = reply.send(Ok(()));
            }
            ProxyMsg::Instance(reply) => {
                if state.instance.is_none() {
                    state.refresh();
                }
                let _ = reply.send(state.instance.clone());
            }
            ProxyMsg::AwaitInstance(reply) => {
                if state.instance.is_none() {
                    state.refresh();
                }
                match &state.instance {
                    Some(instance) => {
                        let _ = reply.send(instance.clone());
                    }
                    None => {
                        // Callers that gave up meanwhile are dropped here, so the list
                        // holds only callers still waiting.
                        state.waiting.retain(|w| !w.is_closed());
                        state.waiting.push(reply);
                    }
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ProcessGroupChanged(change) = event
            && change.get_group().starts_with(&state.prefix)
        {
            state.refresh();
        }
        Ok(())
    }
}
