//! Preemption requests on etcd, and why a forcefully preempted grant ends for everyone at
//! most one ttl after the request although its holder's session lives on.
//!
//! **Where.** The request on the grant with token `t` (the holder key's create revision,
//! unique across all keys) is the key `<prefix>requests/<t in hex>`, attached to the
//! holder's session: it goes with the grant (session expiry; a release or take-over deletes
//! it in the same transaction as the holder key). A request is put only if the holder key
//! still has create revision `t` and the request key's mod revision is the one read (0:
//! absent), so [`PreemptionRequest::may_replace`] decides on what is there when it is
//! written.
//!
//! **Refusal.** A holder renews with one keep-alive of its session, then one transaction
//! that writes its session's heartbeat key *and* reads every request key (one range, few
//! keys: only grants being preempted have one), then a read of the session's keys. A grant
//! whose request is forceful at the heartbeat's revision `h` is `Refused`; a reentrant
//! acquire compares the request key's mod revision with the one it judged (no forceful
//! request), so it cannot slip past one either.
//!
//! **End of a forced grant.** The session keep-alive cannot be stopped for one grant (it
//! keeps every key of the owner), so the grant is ended by judgement, the way short ttls
//! already are ([`crate::clock`]): let `f` be the revision since which the grant has had a
//! forceful request without a break (the request key's mod revision, or `forced_since`
//! carried over when a forceful request replaces a forceful one). A client that first saw a
//! response at or past `f` at instant `c`, on its own monotonic clock, judges the grant
//! expired from `c + ttl` on, and may take it over by deleting the holder key and the
//! request key if neither changed since it judged (the heartbeat is *not* compared: it
//! goes on), then creating the holder key anew: a new create revision, a higher token.
//!
//! Why no two holders overlap: the holder's local deadline is `S + ttl - margin`, `S` the
//! instant it sent its last successful renewal (or acquire). That renewal's heartbeat
//! transaction had revision `h` and saw no forceful request, so `h < f` (from `f` on, up
//! to the take-over, the request stayed forceful: the take-over's compare on the request
//! key's mod revision proves it). `S` precedes the server's processing of `h`, which
//! precedes `f`'s, which precedes every response at or past `f`, so `S < c` and the
//! holder's deadline has passed at `c + ttl`. A renewal after the take-over finds its key
//! gone (`NotHeld`). Other contenders judge from their own first sight of `f`, later or
//! equal, and see the grant held until then. Only each client's monotonic clock is read.
//!
//! A non-forceful request replacing a forceful one (a higher priority overtaking it) ends
//! the break-free span: the grant is renewable again from then, and judged by its
//! heartbeat as before (its holder, refused once, has given it up already).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tenure_lease::{FencingToken, PreemptAnswer, PreemptionRequest, StoreError};

use crate::layout::RequestValue;
use crate::store::{Inner, put_leased};

/// How many times a request re-reads after losing a race before giving up with an error.
const RACES: usize = 16;

impl Inner {
    pub(crate) async fn request_preemption(
        &self,
        name: &str,
        token: FencingToken,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        let key = self.layout.lease(name);
        let Ok(token) = i64::try_from(token.get()) else {
            return Ok(PreemptAnswer::Gone);
        };
        let request_key = self.layout.request(token);
        for _ in 0..RACES {
            let (kvs, context) = self
                .snapshot(
                    TxnOp::get(key.clone(), None),
                    "request preemption (read)",
                    &key,
                )
                .await?;
            let Some(kv) = kvs.first().filter(|kv| kv.create_revision() == token) else {
                return Ok(PreemptAnswer::Gone);
            };
            let held = self.judge(name, kv, &context)?;
            if held.expired {
                return Ok(PreemptAnswer::Gone);
            }
            let pending = held.pending.as_ref().map(|p| p.request.clone());
            if !request.may_replace(held.value.priority, pending.as_ref()) {
                return Ok(PreemptAnswer::Refused(held.record));
            }
            // A forceful request replacing a forceful one keeps the span without a break.
            let forced_since = held
                .pending
                .as_ref()
                .zip(context.request(token))
                .and_then(|(p, kv)| p.forced_at(kv.mod_revision()));
            let value = RequestValue::new(request, forced_since);
            let resp = self
                .txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(key.clone(), CompareOp::Equal, token),
                            // Still on the session the request is attached to.
                            Compare::lease(key.clone(), CompareOp::Equal, kv.lease()),
                            Compare::mod_revision(
                                request_key.clone(),
                                CompareOp::Equal,
                                held.request_rev,
                            ),
                        ])
                        .and_then([put_leased(request_key.clone(), value.encode(), kv.lease())]),
                    "request preemption",
                    &request_key,
                )
                .await;
            match resp {
                // The holder's session ended between the read and the write: read again.
                Err(e) if e.to_string().contains("lease not found") => continue,
                Err(e) => return Err(e),
                Ok(resp) if resp.succeeded() => {
                    let mut record = held.record;
                    record.request = Some(request.clone());
                    return Ok(PreemptAnswer::Recorded(record));
                }
                Ok(_) => continue,
            }
        }
        Err(StoreError::unavailable(
            "etcd",
            format!("request preemption of {key}: lost {RACES} races with other clients in a row"),
        ))
    }

    pub(crate) async fn withdraw_preemption(
        &self,
        name: &str,
        token: FencingToken,
        by: &str,
    ) -> Result<bool, StoreError> {
        let key = self.layout.lease(name);
        let Ok(token) = i64::try_from(token.get()) else {
            return Ok(false);
        };
        let request_key = self.layout.request(token);
        for _ in 0..RACES {
            let (kvs, context) = self
                .snapshot(
                    TxnOp::get(key.clone(), None),
                    "withdraw preemption (read)",
                    &key,
                )
                .await?;
            let Some(kv) = kvs.first().filter(|kv| kv.create_revision() == token) else {
                return Ok(false);
            };
            let held = self.judge(name, kv, &context)?;
            if held.expired || held.pending.as_ref().is_none_or(|p| p.request.by != by) {
                return Ok(false);
            }
            let resp = self
                .txn(
                    Txn::new()
                        .when([Compare::mod_revision(
                            request_key.clone(),
                            CompareOp::Equal,
                            held.request_rev,
                        )])
                        .and_then([TxnOp::delete(request_key.clone(), None)]),
                    "withdraw preemption",
                    &request_key,
                )
                .await?;
            if resp.succeeded() {
                return Ok(true);
            }
        }
        Err(StoreError::unavailable(
            "etcd",
            format!(
                "withdraw preemption from {key}: lost {RACES} races with other clients in a row"
            ),
        ))
    }
}
