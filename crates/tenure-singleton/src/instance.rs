//! A singleton in the shape of a sharded entity: implement [`Singleton`] (a `start` that
//! builds the state under the grant, a `handle` per request, an optional `stop`) instead of
//! a whole ractor actor, run it with [`start_singleton`], and reach it from any node with
//! a [`SingletonRef`]. Requests and replies are serde types; they travel between nodes
//! encoded, as an entity's do.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenure_cluster::Node;
use tenure_lease::LeaseProvider;

use crate::manager::{SingletonContext, Spawner, StartingInstance};
use crate::proxy::{ProxyError, SingletonProxy};
use crate::{ManagerMsg, SingletonError};

/// A cluster singleton written as a state and a request handler, the way a sharded
/// `Entity` is: at most one instance runs in the cluster, under the singleton's lease.
pub trait Singleton: Send + Sync + 'static {
    /// What the singleton is told or asked.
    type Request: Serialize + DeserializeOwned + Send + 'static;
    /// What it answers to an ask.
    type Reply: Serialize + DeserializeOwned + Send + 'static;
    /// The instance's state, built by `start`.
    type State: Send + 'static;

    /// Builds the state when an instance starts, under a new grant of the singleton's lease
    /// (`ctx.token` is its fencing token). An `Err` fails the start: the manager tries
    /// again after its restart pause.
    fn start(
        &self,
        ctx: &SingletonContext,
    ) -> impl Future<Output = Result<Self::State, ActorProcessingErr>> + Send;

    /// Handles one request. An `Err` is sent back to an asking caller and ends the
    /// instance without its `stop` (the manager starts a new one, under a new grant, after
    /// its restart pause).
    fn handle(
        &self,
        ctx: &SingletonContext,
        state: &mut Self::State,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Reply, ActorProcessingErr>> + Send;

    /// Runs when the instance stops gracefully (hand-over, leave, lease lost); not when it
    /// is killed after the stop timeout.
    fn stop(
        &self,
        ctx: &SingletonContext,
        state: &mut Self::State,
    ) -> impl Future<Output = ()> + Send {
        let _ = (ctx, state);
        async {}
    }
}

tenure_cluster::cluster_message! {
    /// A request to a [`Singleton`]'s instance, encoded: what a [`SingletonRef`] sends.
    ///
    /// - `Tell`: a request that wants no answer.
    /// - `Ask`: a request and the port for its encoded reply, or why there is none.
    // The macro takes no attributes on variants, so they are documented in the list above.
    #[allow(missing_docs)]
    pub enum InstanceMsg {
        cast Tell(Vec<u8>),
        call Ask(Vec<u8>) -> Result<Vec<u8>, String>,
    }
}

/// The [`Spawner`] of singleton `singleton`: each instance is an actor running it.
pub fn singleton_spawner<S: Singleton>(singleton: S) -> Spawner {
    let singleton = Arc::new(singleton);
    Arc::new(move |ctx: SingletonContext| {
        let supervisor = ctx.supervisor.clone();
        let (actor, started) = ractor::ActorRuntime::spawn_linked_instant(
            None,
            InstanceActor::<S>(PhantomData),
            (singleton.clone(), ctx),
            supervisor,
        )?;
        Ok(StartingInstance {
            cell: actor.get_cell(),
            started,
        })
    })
}

/// Runs singleton `name` on `node` ([`start_on_node`](crate::start_on_node) with the
/// instance made of `singleton`). Every node that may host it calls this.
pub async fn start_singleton<S: Singleton>(
    node: &Node,
    provider: &LeaseProvider,
    name: &str,
    singleton: S,
) -> Result<ActorRef<ManagerMsg>, SingletonError> {
    crate::start_on_node(node, provider, name, singleton_spawner(singleton)).await
}

/// A typed handle to singleton `S` from any node: what [`proxy_on_node`](crate::proxy_on_node)
/// routes, with requests and replies encoded for the wire.
pub struct SingletonRef<S: Singleton> {
    name: String,
    proxy: SingletonProxy<InstanceMsg>,
    singleton: PhantomData<fn() -> S>,
}

impl<S: Singleton> Clone for SingletonRef<S> {
    fn clone(&self) -> Self {
        SingletonRef {
            name: self.name.clone(),
            proxy: self.proxy.clone(),
            singleton: PhantomData,
        }
    }
}

const CODEC: &str = "singleton request";

impl<S: Singleton> SingletonRef<S> {
    /// The handle that sends through `proxy` (a proxy of this singleton's instances).
    pub fn new(proxy: SingletonProxy<InstanceMsg>) -> Self {
        SingletonRef {
            name: proxy.name().to_string(),
            proxy,
            singleton: PhantomData,
        }
    }

    /// The handle of singleton `name` on `node` (any node of the cluster, hosting it or
    /// not); `Err` names the singleton: a bad name or config, or the proxy could not start.
    pub async fn on_node(
        node: &Node,
        provider: &LeaseProvider,
        name: &str,
    ) -> Result<Self, SingletonError> {
        Ok(SingletonRef::new(
            crate::proxy_on_node(node, provider, name).await?,
        ))
    }

    /// Sends `request` to the instance, in order with this handle's other tells, buffered
    /// while no instance is known. `Ok` once the proxy took it (no answer is awaited); `Err`
    /// if it cannot be encoded, the buffer is full, or the proxy stopped.
    pub async fn tell(&self, request: &S::Request) -> Result<(), ProxyError> {
        let bytes = self.encode(request)?;
        self.proxy.send(InstanceMsg::Tell(bytes)).await
    }

    /// Asks the instance, waiting up to `timeout` for one to be known and to answer. `Ok`
    /// is its reply; `Err` says why there is none: no instance within the wait, no answer,
    /// or the instance's `handle` failed (its error, in [`ProxyError::Call`]).
    pub async fn ask(
        &self,
        request: &S::Request,
        timeout: Duration,
    ) -> Result<S::Reply, ProxyError> {
        let bytes = self.encode(request)?;
        let reply = self
            .proxy
            .call(|port| InstanceMsg::Ask(bytes, port), timeout)
            .await?
            .map_err(|detail| self.failed(detail))?;
        tenure_cluster::codec::decode_inner(CODEC, &self.name, &reply)
            .map_err(|_| self.failed("its reply could not be decoded".into()))
    }

    fn encode(&self, request: &S::Request) -> Result<Vec<u8>, ProxyError> {
        tenure_cluster::codec::encode_inner(CODEC, &self.name, request).map_err(|_| {
            self.failed(
                "the request could not be encoded (or is over cluster.max-frame-size)".into(),
            )
        })
    }

    fn failed(&self, detail: String) -> ProxyError {
        ProxyError::Call {
            name: self.name.clone(),
            detail,
        }
    }
}

/// The actor running one instance of a [`Singleton`].
struct InstanceActor<S>(PhantomData<fn() -> S>);

struct InstanceState<S: Singleton> {
    singleton: Arc<S>,
    ctx: SingletonContext,
    state: S::State,
}

impl<S: Singleton> Actor for InstanceActor<S> {
    type Msg = InstanceMsg;
    type State = InstanceState<S>;
    type Arguments = (Arc<S>, SingletonContext);

    async fn pre_start(
        &self,
        _myself: ActorRef<InstanceMsg>,
        (singleton, ctx): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let state = singleton.start(&ctx).await?;
        Ok(InstanceState {
            singleton,
            ctx,
            state,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<InstanceMsg>,
        s: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        s.singleton.stop(&s.ctx, &mut s.state).await;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<InstanceMsg>,
        msg: InstanceMsg,
        s: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (bytes, port) = match msg {
            InstanceMsg::Tell(bytes) => (bytes, None),
            InstanceMsg::Ask(bytes, port) => (bytes, Some(port)),
        };
        let request =
            match tenure_cluster::codec::decode_inner::<S::Request>(CODEC, &s.ctx.name, &bytes) {
                Ok(request) => request,
                Err(_) => {
                    // A request this version cannot read is the sender's problem, not a reason
                    // to stop the singleton.
                    if let Some(port) = port {
                        let _ = port.send(Err(format!(
                            "singleton {}: undecodable request",
                            s.ctx.name
                        )));
                    }
                    return Ok(());
                }
            };
        match s.singleton.handle(&s.ctx, &mut s.state, request).await {
            Ok(reply) => {
                if let Some(port) = port {
                    let encoded = tenure_cluster::codec::encode_inner(CODEC, &s.ctx.name, &reply)
                        .map_err(|_| {
                            format!("singleton {}: its reply could not be encoded", s.ctx.name)
                        });
                    let _ = port.send(encoded);
                }
                Ok(())
            }
            Err(e) => {
                if let Some(port) = port {
                    let _ = port.send(Err(e.to_string()));
                }
                Err(e)
            }
        }
    }
}
