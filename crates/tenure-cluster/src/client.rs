//! A short-lived client of one node (the CLI's `tenure cluster …`): joins the node's mesh as
//! a non-member over an authenticated (and, when configured, TLS) session and asks its agent.

use std::time::Duration;

use ractor::{Actor, ActorId, ActorRef, pg};
use ractor_cluster::node::{NodeConnectionMode, NodeServerSessionInformation};
use ractor_cluster::{
    IncomingEncryptionMode, NodeEventSubscription, NodeServer, NodeServerMessage,
};
use tokio::sync::mpsc;

use crate::agent::{AGENT_GROUP, scope};
use crate::error::ClusterError;
use crate::identity::NodeAddr;
use crate::protocol::{AgentMsg, NodeView, ask_set_link, ask_view};
use crate::settings::ClusterSettings;
use crate::transport::{LinkFault, Tls, dial};

/// A connection to one node's agent.
pub struct ClusterClient {
    node: NodeAddr,
    server: ActorRef<NodeServerMessage>,
    agent: ActorRef<AgentMsg>,
}

struct Ready(mpsc::UnboundedSender<(bool, NodeServerSessionInformation)>);

impl NodeEventSubscription for Ready {
    fn node_session_opened(&self, _: NodeServerSessionInformation) {}
    fn node_session_authenticated(&self, _: NodeServerSessionInformation) {}
    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        let _ = self.0.send((false, ses));
    }
    fn node_session_ready(&self, ses: NodeServerSessionInformation) {
        let _ = self.0.send((true, ses));
    }
}

/// Tells a channel of every change to the process groups of a scope, while it runs.
struct GroupNotices;

impl Actor for GroupNotices {
    type Msg = ();
    type State = (String, mpsc::UnboundedSender<()>);
    type Arguments = (String, mpsc::UnboundedSender<()>);

    async fn pre_start(
        &self,
        myself: ActorRef<()>,
        (scope, notice): Self::Arguments,
    ) -> Result<Self::State, ractor::ActorProcessingErr> {
        pg::monitor_scope(scope.clone(), myself.get_cell());
        Ok((scope, notice))
    }

    async fn post_stop(
        &self,
        myself: ActorRef<()>,
        (scope, _): &mut Self::State,
    ) -> Result<(), ractor::ActorProcessingErr> {
        pg::demonitor_scope(scope.clone(), myself.get_id());
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: ractor::SupervisionEvent,
        (_, notice): &mut Self::State,
    ) -> Result<(), ractor::ActorProcessingErr> {
        if let ractor::SupervisionEvent::ProcessGroupChanged(_) = event {
            let _ = notice.send(());
        }
        Ok(())
    }
}

impl ClusterClient {
    /// Connects to `node` with the cookie and TLS files of `settings`.
    pub async fn connect(
        settings: &ClusterSettings,
        node: &NodeAddr,
    ) -> Result<ClusterClient, ClusterError> {
        let fail = |detail: String| ClusterError::Connect {
            addr: node.to_string(),
            detail,
        };
        let tls = settings.tls.as_ref().map(Tls::load).transpose()?;
        crate::codec::set_local_label(&format!("client-{}", std::process::id()));
        let server = NodeServer::new(
            0,
            settings.cookie.clone(),
            format!("client-{}", std::process::id()),
            "local".into(),
            tls.as_ref()
                .map(|t| IncomingEncryptionMode::Tls(t.acceptor.clone())),
            Some(NodeConnectionMode::Isolated),
        )
        .with_listen_addr(std::net::Ipv4Addr::LOCALHOST.into());
        let (server, _) = Actor::spawn(None, server, ())
            .await
            .map_err(|e| fail(format!("cannot start a client node: {e}")))?;
        let client = ClusterClient::attach(settings, node, server.clone(), tls).await;
        if client.is_err() {
            server.stop(None);
        }
        client
    }

    async fn attach(
        settings: &ClusterSettings,
        node: &NodeAddr,
        server: ActorRef<NodeServerMessage>,
        tls: Option<Tls>,
    ) -> Result<ClusterClient, ClusterError> {
        let fail = |detail: String| ClusterError::Connect {
            addr: node.to_string(),
            detail,
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "client".into(),
                subscription: Box::new(Ready(tx)),
            })
            .map_err(|e| fail(e.to_string()))?;
        dial(&server, node, tls.as_ref(), settings.dial_timeout).await?;
        let wait = settings.dial_timeout * 2;
        let ready = tokio::time::timeout(wait, rx.recv()).await;
        let ses = match ready {
            Ok(Some((true, ses))) => ses,
            Ok(Some((false, _))) | Ok(None) => {
                return Err(fail("the node closed the session: wrong cookie, TLS mismatch, or not a Tenure node (see the node's log)".into()));
            }
            Err(_) => return Err(fail(format!("no authenticated session within {wait:?}"))),
        };
        let scope = scope(&settings.system);
        let (notice, mut notices) = mpsc::unbounded_channel();
        let (watch, _) = Actor::spawn(None, GroupNotices, (scope.clone(), notice))
            .await
            .map_err(|e| fail(format!("cannot watch the node's process groups: {e}")))?;
        let give_up = tokio::time::Instant::now() + settings.dial_timeout;
        let agent = loop {
            // Watched before looking: a group change after this look is noticed.
            let agent = pg::get_scoped_members(&scope, &AGENT_GROUP.to_string())
                .into_iter()
                .find(
                    |c| matches!(c.get_id(), ActorId::Remote { node_id, .. } if node_id == ses.node_id),
                );
            if agent.is_some() {
                break agent;
            }
            match tokio::time::timeout_at(give_up, notices.recv()).await {
                Ok(Some(())) => {}
                Ok(None) | Err(_) => break None,
            }
        };
        watch.stop(None);
        match agent {
            Some(agent) => Ok(ClusterClient {
                node: node.clone(),
                server,
                agent: agent.into(),
            }),
            None => Err(fail(format!(
                "no Tenure agent of system `{}` there",
                settings.system
            ))),
        }
    }

    /// The node's view of the cluster.
    pub async fn view(&self) -> Result<NodeView, ClusterError> {
        ask_view(&self.agent).await.map_err(|e| self.no_answer(e))
    }

    /// Sets the node's link fault with `peer`; [`LinkFault::None`] heals it (needs
    /// `cluster.fault-injection`).
    pub async fn set_link(&self, peer: &NodeAddr, fault: LinkFault) -> Result<(), ClusterError> {
        match ask_set_link(&self.agent, peer, fault)
            .await
            .map_err(|e| self.no_answer(e))?
        {
            None => Ok(()),
            Some(detail) => Err(ClusterError::Connect {
                addr: self.node.to_string(),
                detail,
            }),
        }
    }

    /// The error of a question the node's agent did not answer, `why`.
    fn no_answer(&self, why: impl std::fmt::Display) -> ClusterError {
        ClusterError::Connect {
            addr: self.node.to_string(),
            detail: format!("no answer: {why}"),
        }
    }

    /// Closes the session.
    pub async fn close(self) {
        let _ = self
            .server
            .stop_and_wait(None, Some(Duration::from_secs(2)))
            .await;
    }
}
