//! A test double of another node's region, for the unit tests of the routed and direct
//! paths and of the coordinator.

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use crate::messages::{Envelope, RegionMsg, Vacated};

/// Another node's region: reports what `report` makes of each message it is sent (and
/// ignores the messages it makes nothing of).
pub(crate) struct RegionDouble<T> {
    report: Box<dyn Fn(RegionMsg) -> Option<T> + Send + Sync>,
    to: UnboundedSender<T>,
}

impl<T: Send + 'static> RegionDouble<T> {
    pub(crate) fn new(
        to: UnboundedSender<T>,
        report: impl Fn(RegionMsg) -> Option<T> + Send + Sync + 'static,
    ) -> Self {
        RegionDouble {
            report: Box::new(report),
            to,
        }
    }
}

impl RegionDouble<Envelope> {
    /// Reports the envelopes it is sent (tells and asks); answers `Vacate` (a barrier:
    /// everything sent to it before has been reported).
    pub(crate) fn envelopes(to: UnboundedSender<Envelope>) -> Self {
        RegionDouble::new(to, |msg| match msg {
            RegionMsg::Deliver(env) | RegionMsg::Ask(env, _) => Some(env),
            RegionMsg::Vacate(_, reply) => {
                let _ = reply.send(Vacated {
                    region: "127.0.0.1:2".into(),
                });
                None
            }
            _ => None,
        })
    }
}

impl<T: Send + 'static> Actor for RegionDouble<T> {
    type Msg = RegionMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<RegionMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<RegionMsg>,
        msg: RegionMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        if let Some(report) = (self.report)(msg) {
            let _ = self.to.send(report);
        }
        Ok(())
    }
}
