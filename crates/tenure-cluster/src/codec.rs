//! The wire codec of cluster messages: serde payloads encoded with bincode 2, one payload
//! struct per message variant, behind ractor's serialized-message interface.
//!
//! A message enum declared with [`cluster_message!`](crate::cluster_message) is remotable:
//! each `cast`/`call` variant travels as ractor's `Cast`/`Call` frame tagged with the
//! variant *name* (never rename a variant; adding one is compatible). The payload bytes are
//! the sender's node address then the bincode payload, so that a frame that cannot be
//! decoded is logged at warn with the peer and the variant and dropped; the node keeps running.
//! Decoding is bounded by [`MAX_PAYLOAD_BYTES`], so a corrupt length cannot make it allocate
//! without limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use ractor::RpcReplyPort;
use ractor::message::BoxedDowncastErr;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest payload (bytes) a node decodes; larger frames are dropped with a warning.
pub const MAX_PAYLOAD_BYTES: usize = 8 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_PAYLOAD_BYTES>()
}

static LOCAL_LABEL: RwLock<Option<Arc<str>>> = RwLock::new(None);

/// Bytes a frame carries besides the payload (ractor's envelope: ids, variant, lengths).
const FRAME_OVERHEAD: u64 = 1024;

static MAX_ENCODE: AtomicUsize = AtomicUsize::new(MAX_PAYLOAD_BYTES);

/// Bounds what this process sends by the peers' inbound frame limit (`cluster.max-frame-size`,
/// the same on every node): a larger message is refused here, with a warning, instead of
/// making the peer drop the whole session.
pub fn set_max_payload(max_frame_size: u64) {
    let limit = max_frame_size
        .saturating_sub(FRAME_OVERHEAD)
        .min(MAX_PAYLOAD_BYTES as u64);
    MAX_ENCODE.store(limit as usize, Ordering::Relaxed);
}

/// Sets the sender label this process puts in every frame (its node address). ractor's
/// registry is process-wide, so one process is one node.
pub fn set_local_label(label: &str) {
    *LOCAL_LABEL.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(label));
}

fn local_label() -> Arc<str> {
    LOCAL_LABEL
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| Arc::from("unnamed"))
}

/// Encodes `payload` of `message::variant` behind this node's label.
pub fn encode<T: Serialize>(
    message: &str,
    variant: &str,
    payload: &T,
) -> Result<Vec<u8>, BoxedDowncastErr> {
    let mut out = Vec::with_capacity(64);
    let result = bincode::serde::encode_into_std_write(&*local_label(), &mut out, config())
        .and_then(|_| bincode::serde::encode_into_std_write(payload, &mut out, config()));
    within_limit(message, variant, out, result.map(|_| ())).map_err(|e| {
        tracing::warn!(error = %e, "cluster message not sent");
        BoxedDowncastErr
    })
}

/// Encodes `payload` of `message::variant` to travel inside another message (an entity's
/// request or reply): without a label, which the frame around it carries; under the same
/// size limit as [`encode`]. Read it with [`decode_inner`]. `Err` (logged at warn) when it
/// cannot be encoded or is over the limit; [`encode_inner_to`] says which.
pub fn encode_inner<T: Serialize>(
    message: &str,
    variant: &str,
    payload: &T,
) -> Result<Vec<u8>, BoxedDowncastErr> {
    encode_inner_to(message, variant, payload, Vec::with_capacity(16)).map_err(|e| {
        tracing::warn!(error = %e, "cluster message not sent");
        BoxedDowncastErr
    })
}

/// Why a payload could not be encoded ([`encode_inner_to`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Its serializer failed (a map with non-string keys, say). The source is shared
    /// (`Arc`) so that the error stays `Clone`.
    #[error("cannot encode {message} `{variant}`: {source}")]
    Serialize {
        /// The message kind (`entity request`, say).
        message: String,
        /// The variant or type it was encoded for.
        variant: String,
        /// The codec's error.
        #[source]
        source: Arc<bincode::error::EncodeError>,
    },
    /// Encoded, it is larger than a peer takes (`cluster.max-frame-size`).
    #[error(
        "{message} `{variant}` is {bytes} bytes encoded, over the {limit} bytes cluster.max-frame-size allows"
    )]
    TooLarge {
        /// The message kind.
        message: String,
        /// The variant or type it was encoded for.
        variant: String,
        /// Its encoded size.
        bytes: usize,
        /// The largest payload peers take.
        limit: usize,
    },
}

/// As [`encode_inner`], appending to `out` (a buffer that keeps small payloads inline, say)
/// and giving it back: `Ok(out)` when `payload` is encoded within the size limit;
/// `Err(Serialize)` when it cannot be encoded, `Err(TooLarge)` when it is over the limit
/// (nothing is logged: the caller has the error).
pub fn encode_inner_to<T: Serialize, B: std::io::Write + AsRef<[u8]>>(
    message: &str,
    variant: &str,
    payload: &T,
    mut out: B,
) -> Result<B, EncodeError> {
    let result = bincode::serde::encode_into_std_write(payload, &mut out, config());
    within_limit(message, variant, out, result.map(|_| ()))
}

fn within_limit<B: AsRef<[u8]>>(
    message: &str,
    variant: &str,
    out: B,
    result: Result<(), bincode::error::EncodeError>,
) -> Result<B, EncodeError> {
    let limit = MAX_ENCODE.load(Ordering::Relaxed);
    match result {
        Ok(()) if out.as_ref().len() <= limit => Ok(out),
        Ok(()) => Err(EncodeError::TooLarge {
            message: message.to_string(),
            variant: variant.to_string(),
            bytes: out.as_ref().len(),
            limit,
        }),
        Err(e) => Err(EncodeError::Serialize {
            message: message.to_string(),
            variant: variant.to_string(),
            source: Arc::new(e),
        }),
    }
}

/// Decodes a payload of `message::variant` encoded by [`encode_inner`]; logs at warn and
/// fails when it cannot (or when bytes are left over).
pub fn decode_inner<T: DeserializeOwned>(
    message: &str,
    variant: &str,
    bytes: &[u8],
) -> Result<T, BoxedDowncastErr> {
    match bincode::serde::decode_from_slice::<T, _>(bytes, config()) {
        Ok((value, n)) if n == bytes.len() => Ok(value),
        Ok(_) => {
            tracing::warn!(
                message,
                variant,
                bytes = bytes.len(),
                "payload with trailing bytes dropped (incompatible peer version?)"
            );
            Err(BoxedDowncastErr)
        }
        Err(e) => {
            tracing::warn!(message, variant, bytes = bytes.len(), error = %e, "undecodable payload dropped");
            Err(BoxedDowncastErr)
        }
    }
}

/// Decodes a payload of `message::variant` encoded by [`encode`]; logs at warn (naming
/// the peer when its label is readable) and fails when it cannot.
pub fn decode<T: DeserializeOwned>(
    message: &str,
    variant: &str,
    bytes: &[u8],
) -> Result<T, BoxedDowncastErr> {
    // Borrowed from the frame: the label is read for every message, and used only to name
    // the peer of a frame that cannot be decoded.
    let (peer, used) = match bincode::serde::borrow_decode_from_slice::<&str, _>(bytes, config()) {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(peer = "unknown", message, variant, bytes = bytes.len(), error = %e, "undecodable cluster message dropped");
            return Err(BoxedDowncastErr);
        }
    };
    match bincode::serde::decode_from_slice::<T, _>(&bytes[used..], config()) {
        Ok((value, n)) if used + n == bytes.len() => Ok(value),
        Ok(_) => {
            tracing::warn!(%peer, message, variant, bytes = bytes.len(), "cluster message with trailing bytes dropped (incompatible peer version?)");
            Err(BoxedDowncastErr)
        }
        Err(e) => {
            tracing::warn!(%peer, message, variant, bytes = bytes.len(), error = %e, "undecodable cluster message dropped");
            Err(BoxedDowncastErr)
        }
    }
}

/// Logs a frame whose variant this node does not know and returns the drop error.
pub fn unknown_variant(message: &str, kind: &str, variant: &str, bytes: &[u8]) -> BoxedDowncastErr {
    let peer = bincode::serde::decode_from_slice::<String, _>(bytes, config())
        .map(|(p, _)| p)
        .unwrap_or_else(|_| "unknown".into());
    tracing::warn!(%peer, message, kind, variant, "cluster message of an unknown variant dropped (newer peer?)");
    BoxedDowncastErr
}

/// Sender side of a remote call: a byte reply port that decodes the answer into `port`.
pub fn bytes_reply_port<R: DeserializeOwned + Send + 'static>(
    message: &'static str,
    variant: &'static str,
    port: RpcReplyPort<R>,
) -> RpcReplyPort<Vec<u8>> {
    let (tx, rx) = ractor::concurrency::oneshot::<Vec<u8>>();
    let timeout = port.get_timeout();
    tokio::spawn(async move {
        let bytes = match timeout {
            Some(t) => tokio::time::timeout(t, rx).await.ok().and_then(Result::ok),
            None => rx.await.ok(),
        };
        if let Some(bytes) = bytes
            && let Ok(reply) = decode::<R>(message, variant, &bytes)
        {
            let _ = port.send(reply);
        }
    });
    match timeout {
        Some(t) => RpcReplyPort::from((tx, t)),
        None => RpcReplyPort::from(tx),
    }
}

/// Receiver side of a remote call: a typed reply port whose answer is encoded into `port`.
pub fn typed_reply_port<R: Serialize + Send + 'static>(
    message: &'static str,
    variant: &'static str,
    port: RpcReplyPort<Vec<u8>>,
) -> RpcReplyPort<R> {
    let (tx, rx) = ractor::concurrency::oneshot::<R>();
    let timeout = port.get_timeout();
    tokio::spawn(async move {
        let reply = match timeout {
            Some(t) => tokio::time::timeout(t, rx).await.ok().and_then(Result::ok),
            None => rx.await.ok(),
        };
        if let Some(reply) = reply
            && let Ok(bytes) = encode(message, variant, &reply)
        {
            let _ = port.send(bytes);
        }
    });
    match timeout {
        Some(t) => RpcReplyPort::from((tx, t)),
        None => RpcReplyPort::from(tx),
    }
}

/// Declares a remotable message enum whose variants carry one serde payload each.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// #[derive(Debug, Serialize, Deserialize)] pub struct Ping { pub seq: u64 }
/// #[derive(Debug, Serialize, Deserialize)] pub struct Pong { pub seq: u64 }
/// pub struct Tick;
/// tenure_cluster::cluster_message! {
///     /// Messages of an example actor.
///     pub enum ExampleMsg {
///         cast Ping(Ping),
///         call Echo(Ping) -> Pong,
///         local Tick(Tick),
///     }
/// }
/// ```
/// `cast` variants are one-way, `call` variants carry a reply port for the given reply
/// type, `local` variants are never sent to another node (sending one to a remote actor
/// fails). Groups appear in this order; each may be empty.
#[macro_export]
macro_rules! cluster_message {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$cmeta:meta])* cast $cvar:ident($cty:ty), )*
            $( $(#[$rmeta:meta])* call $rvar:ident($rty:ty) -> $rrep:ty, )*
            $( $(#[$lmeta:meta])* local $lvar:ident($lty:ty), )*
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$cmeta])* $cvar($cty), )*
            $( $(#[$rmeta])* $rvar($rty, $crate::__private::ractor::RpcReplyPort<$rrep>), )*
            $( $(#[$lmeta])* $lvar($lty), )*
        }

        impl $crate::__private::ractor::Message for $name {
            fn serializable() -> bool {
                true
            }

            fn serialize(
                self,
            ) -> ::std::result::Result<$crate::__private::ractor::message::SerializedMessage, $crate::__private::ractor::message::BoxedDowncastErr> {
                const MESSAGE: &str = stringify!($name);
                match self {
                    $( Self::$cvar(payload) => Ok($crate::__private::ractor::message::SerializedMessage::Cast {
                        variant: stringify!($cvar).to_string(),
                        args: $crate::codec::encode(MESSAGE, stringify!($cvar), &payload)?,
                        metadata: None,
                    }), )*
                    $( Self::$rvar(payload, reply) => Ok($crate::__private::ractor::message::SerializedMessage::Call {
                        variant: stringify!($rvar).to_string(),
                        args: $crate::codec::encode(MESSAGE, stringify!($rvar), &payload)?,
                        reply: $crate::codec::bytes_reply_port::<$rrep>(MESSAGE, stringify!($rvar), reply),
                        metadata: None,
                    }), )*
                    $( Self::$lvar(_) => Err($crate::__private::ractor::message::BoxedDowncastErr), )*
                }
            }

            fn deserialize(
                message: $crate::__private::ractor::message::SerializedMessage,
            ) -> ::std::result::Result<Self, $crate::__private::ractor::message::BoxedDowncastErr> {
                const MESSAGE: &str = stringify!($name);
                match message {
                    $crate::__private::ractor::message::SerializedMessage::Cast { variant, args, .. } => {
                        $( if variant == stringify!($cvar) {
                            return $crate::codec::decode::<$cty>(MESSAGE, &variant, &args).map(Self::$cvar);
                        } )*
                        Err($crate::codec::unknown_variant(MESSAGE, "cast", &variant, &args))
                    }
                    $crate::__private::ractor::message::SerializedMessage::Call { variant, args, reply, .. } => {
                        $( if variant == stringify!($rvar) {
                            let payload = $crate::codec::decode::<$rty>(MESSAGE, &variant, &args)?;
                            return Ok(Self::$rvar(
                                payload,
                                $crate::codec::typed_reply_port::<$rrep>(MESSAGE, stringify!($rvar), reply),
                            ));
                        } )*
                        let _ = reply;
                        Err($crate::codec::unknown_variant(MESSAGE, "call", &variant, &args))
                    }
                    _ => Err($crate::__private::ractor::message::BoxedDowncastErr),
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use ractor::Message;
    use ractor::message::SerializedMessage;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    pub struct Note {
        pub text: String,
        pub n: u64,
    }
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    pub struct Blob {
        pub bytes: Vec<u8>,
    }
    #[derive(Debug)]
    pub struct Tick;

    crate::cluster_message! {
        #[derive(Debug)]
        pub enum TestMsg {
            cast Say(Note),
            cast Big(Blob),
            call Ask(Note) -> Note,
            local Tick(Tick),
        }
    }

    fn cast_parts(m: SerializedMessage) -> (String, Vec<u8>) {
        match m {
            SerializedMessage::Cast { variant, args, .. } => (variant, args),
            _ => panic!("expected a cast"),
        }
    }

    #[test]
    fn casts_round_trip_with_the_variant_name_as_tag() {
        super::set_local_label("127.0.0.1:1");
        let note = Note {
            text: "hi".into(),
            n: 7,
        };
        let (variant, args) = cast_parts(TestMsg::Say(note).serialize().unwrap());
        assert_eq!(variant, "Say");
        let back = TestMsg::deserialize(SerializedMessage::Cast {
            variant,
            args,
            metadata: None,
        })
        .unwrap();
        assert!(matches!(back, TestMsg::Say(Note { ref text, n: 7 }) if text == "hi"));
    }

    #[test]
    fn garbage_unknown_variants_and_wrong_types_are_dropped_not_panicking() {
        let (_, args) = cast_parts(
            TestMsg::Say(Note {
                text: "x".into(),
                n: 1,
            })
            .serialize()
            .unwrap(),
        );
        // Right bytes, other variant's type: Blob cannot be read from a Note's bytes exactly.
        let wrong = SerializedMessage::Cast {
            variant: "Big".into(),
            args: args.clone(),
            metadata: None,
        };
        assert!(TestMsg::deserialize(wrong).is_err());
        let unknown = SerializedMessage::Cast {
            variant: "Renamed".into(),
            args,
            metadata: None,
        };
        assert!(TestMsg::deserialize(unknown).is_err());
        let garbage = SerializedMessage::Cast {
            variant: "Say".into(),
            args: vec![0xff; 9],
            metadata: None,
        };
        assert!(TestMsg::deserialize(garbage).is_err());
        assert!(
            TestMsg::Tick(Tick).serialize().is_err(),
            "local variants never go on the wire"
        );
    }

    #[test]
    fn a_length_beyond_the_limit_is_refused_without_allocating_it() {
        // Label "a", then a Vec<u8> claiming u64::MAX bytes (varint 0xff + 8 bytes).
        let mut args = vec![1u8, b'a', 0xff];
        args.extend_from_slice(&u64::MAX.to_le_bytes());
        let m = SerializedMessage::Cast {
            variant: "Big".into(),
            args,
            metadata: None,
        };
        assert!(TestMsg::deserialize(m).is_err());
    }

    #[tokio::test]
    async fn calls_bridge_typed_and_byte_reply_ports() {
        let (tx, rx) = ractor::concurrency::oneshot::<Note>();
        let msg = TestMsg::Ask(
            Note {
                text: "q".into(),
                n: 1,
            },
            tx.into(),
        );
        let SerializedMessage::Call {
            variant,
            args,
            reply,
            ..
        } = msg.serialize().unwrap()
        else {
            panic!("expected a call");
        };
        let TestMsg::Ask(q, port) = TestMsg::deserialize(SerializedMessage::Call {
            variant,
            args,
            reply,
            metadata: None,
        })
        .unwrap() else {
            panic!("expected Ask");
        };
        port.send(Note {
            text: format!("{}!", q.text),
            n: q.n + 1,
        })
        .unwrap();
        assert_eq!(
            rx.await.unwrap(),
            Note {
                text: "q!".into(),
                n: 2
            }
        );
    }

    /// A value whose serializer fails, as a map with a non-string key fails in JSON.
    struct Unencodable;

    impl serde::Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("the serializer refused it"))
        }
    }

    #[test]
    fn an_inner_payload_that_cannot_be_encoded_or_is_too_large_says_which() {
        let err =
            super::encode_inner_to("entity request", "cart", &Unencodable, Vec::new()).unwrap_err();
        assert!(
            matches!(&err, super::EncodeError::Serialize { variant, .. } if variant == "cart"),
            "{err:?}"
        );
        assert!(
            std::error::Error::source(&err)
                .is_some_and(|s| s.to_string().contains("the serializer refused it")),
            "{err:?}"
        );
        let blob = vec![0u8; super::MAX_PAYLOAD_BYTES + 1];
        let err = super::encode_inner_to("entity request", "cart", &blob, Vec::new()).unwrap_err();
        assert!(
            matches!(err, super::EncodeError::TooLarge { bytes, limit, .. } if bytes > limit),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with("entity request `cart` is ")
                && err.to_string().contains("bytes encoded, over the"),
            "{err}"
        );
    }
}
