//! Test doubles of another node's region, for the unit tests of the routed and direct paths.

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::messages::{Envelope, RegionMsg, Vacated};

/// Another node's region: reports the envelopes it is sent (tells and asks); answers
/// `Vacate` (a barrier: everything sent to it before has been reported).
pub(crate) struct OtherRegion(pub(crate) tokio::sync::mpsc::UnboundedSender<Envelope>);

impl Actor for OtherRegion {
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
        match msg {
            RegionMsg::Deliver(env) | RegionMsg::Ask(env, _) => {
                let _ = self.0.send(env);
            }
            RegionMsg::Vacate(_, reply) => {
                let _ = reply.send(Vacated {
                    region: "127.0.0.1:2".into(),
                });
            }
            _ => {}
        }
        Ok(())
    }
}
