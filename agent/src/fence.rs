//! Fencing: the rules that decide whether a mutating request may act on a volume.
//!
//! Every mutating RPC carries a token `(volume_uid, generation)`. The agent
//! keeps one [`FenceMark`](crate::marks::FenceMark) per volume ID and admits a request only when:
//!
//! 1. it carries a token with a non-empty `volume_uid`;
//! 2. no lifecycle is recorded, or the recorded one has ended and the token's
//!    uid is not an ended one: the request opens a lifecycle;
//! 3. the live lifecycle has the token's uid and a generation no higher than
//!    the token's: the recorded generation rises to the token's;
//! 4. the token's uid has ended: refused, except an identical retry of the
//!    DeleteVolume that ended it, which succeeds without touching anything.
//!    Only a DeleteVolume that destroyed the volume (or found none to
//!    destroy) is recorded for such retries ([`Fence::end`] with its token);
//!    the service ends a PreserveOriginal LV's lifecycle without one.
//!
//! A refusal changes nothing. The functions here are pure; the store that
//! makes marks durable is [`crate::marks`].
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A fencing token carried by a mutating request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// The owning lifecycle's UID.
    pub volume_uid: String,
    /// The publication generation.
    pub generation: u64,
}

/// The lifecycle a mark records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    /// The owner's UID.
    pub volume_uid: String,
    /// The highest generation seen.
    pub generation: u64,
}

/// Why a request was refused by fencing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// The request carries no token.
    #[error("volume {volume_id}: request carries no fencing token (fence.volume_uid is required for every mutating call)")]
    Missing {
        /// The volume.
        volume_id: String,
    },
    /// The token's generation is lower than the recorded one.
    #[error("stale fencing token for volume {volume_id}: generation {got} of lifecycle {volume_uid} is lower than the recorded generation {recorded}")]
    Stale {
        /// The volume.
        volume_id: String,
        /// The lifecycle.
        volume_uid: String,
        /// The request's generation.
        got: u64,
        /// The recorded generation.
        recorded: u64,
    },
    /// Another live lifecycle owns the volume.
    #[error("volume {volume_id} is owned by live lifecycle {owner}; request from lifecycle {requester} refused")]
    OwnedByOther {
        /// The volume.
        volume_id: String,
        /// The owning uid.
        owner: String,
        /// The request's uid.
        requester: String,
    },
    /// The token's lifecycle has ended (released or deleted).
    #[error("stale fencing token for volume {volume_id}: lifecycle {volume_uid} has ended")]
    Ended {
        /// The volume.
        volume_id: String,
        /// The ended uid.
        volume_uid: String,
    },
}

/// The fencing part of a volume's mark.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The live lifecycle, if any.
    pub live: Option<Lifecycle>,
    /// UIDs whose lifecycles have ended.
    pub ended_uids: BTreeSet<String>,
    /// The DeleteVolume token that ended the last lifecycle, for identical
    /// retries; recorded only when that DeleteVolume destroyed the volume or
    /// found none to destroy (not for a PreserveOriginal LV).
    pub deleted_by: Option<Token>,
    /// The ReleaseVolume token that ended the last lifecycle, for identical
    /// retries (a release whose reply was lost is repeated by the
    /// controller, and must succeed without touching anything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_by: Option<Token>,
}

/// What an admitted request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The request opens a new lifecycle.
    Opens,
    /// The request continues the live lifecycle.
    Continues,
    /// The request repeats the DeleteVolume that ended the lifecycle: succeed, touch nothing.
    RepeatsDelete,
    /// The request repeats the ReleaseVolume that ended the lifecycle: succeed, touch nothing.
    RepeatsRelease,
    /// No token was asked for: the work changes no lifecycle (a snapshot's
    /// deletion, which its ID authorizes, or the collection of a volume
    /// kept for its snapshots).
    Unfenced,
}

/// Whether the request is a DeleteVolume (the only call an ended lifecycle may repeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// DeleteVolume.
    Delete,
    /// ReleaseVolume.
    Release,
    /// Any other mutating call.
    Other,
}

impl Fence {
    /// Decides whether `token` may act; on success returns the fence after
    /// admission (generation raised, lifecycle opened) and what kind it is.
    pub fn admit(
        &self,
        volume_id: &str,
        token: Option<&Token>,
        call: Call,
    ) -> Result<(Fence, Admission), FenceError> {
        let token =
            token
                .filter(|t| !t.volume_uid.is_empty())
                .ok_or_else(|| FenceError::Missing {
                    volume_id: volume_id.to_owned(),
                })?;
        if self.ended_uids.contains(&token.volume_uid) {
            if call == Call::Delete && self.deleted_by.as_ref() == Some(token) {
                return Ok((self.clone(), Admission::RepeatsDelete));
            }
            if call == Call::Release && self.released_by.as_ref() == Some(token) {
                return Ok((self.clone(), Admission::RepeatsRelease));
            }
            return Err(FenceError::Ended {
                volume_id: volume_id.to_owned(),
                volume_uid: token.volume_uid.clone(),
            });
        }
        let mut next = self.clone();
        match &self.live {
            None => {
                next.live = Some(Lifecycle {
                    volume_uid: token.volume_uid.clone(),
                    generation: token.generation,
                });
                Ok((next, Admission::Opens))
            }
            Some(live) if live.volume_uid != token.volume_uid => Err(FenceError::OwnedByOther {
                volume_id: volume_id.to_owned(),
                owner: live.volume_uid.clone(),
                requester: token.volume_uid.clone(),
            }),
            Some(live) if token.generation < live.generation => Err(FenceError::Stale {
                volume_id: volume_id.to_owned(),
                volume_uid: live.volume_uid.clone(),
                got: token.generation,
                recorded: live.generation,
            }),
            Some(_) => {
                next.live = Some(Lifecycle {
                    volume_uid: token.volume_uid.clone(),
                    generation: token.generation,
                });
                Ok((next, Admission::Continues))
            }
        }
    }

    /// The fence after the live lifecycle ends; `deleted_by` is the
    /// DeleteVolume token that ended it, if one did.
    pub fn end(&self, deleted_by: Option<Token>) -> Fence {
        let mut next = self.clone();
        if let Some(live) = next.live.take() {
            next.ended_uids.insert(live.volume_uid);
        }
        next.deleted_by = deleted_by;
        next.released_by = None;
        next
    }

    /// The fence after ReleaseVolume with `token` ends the live lifecycle:
    /// an identical retry of that release is admitted as
    /// [`Admission::RepeatsRelease`].
    pub fn end_released(&self, token: Option<Token>) -> Fence {
        let mut next = self.end(None);
        next.released_by = token;
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(uid: &str, generation: u64) -> Token {
        Token {
            volume_uid: uid.into(),
            generation,
        }
    }

    #[test]
    fn lifecycle_rules() {
        let empty = Fence::default();
        assert!(matches!(
            empty.admit("v", None, Call::Other),
            Err(FenceError::Missing { .. })
        ));
        assert!(matches!(
            empty.admit("v", Some(&t("", 1)), Call::Other),
            Err(FenceError::Missing { .. })
        ));

        let (f, a) = empty
            .admit("v", Some(&t("u1", 3)), Call::Other)
            .expect("opens");
        assert_eq!(a, Admission::Opens);
        let (f, a) = f
            .admit("v", Some(&t("u1", 5)), Call::Other)
            .expect("continues");
        assert_eq!(
            (a, f.live.as_ref().map(|l| l.generation)),
            (Admission::Continues, Some(5))
        );
        assert!(matches!(
            f.admit("v", Some(&t("u1", 4)), Call::Other),
            Err(FenceError::Stale {
                got: 4,
                recorded: 5,
                ..
            })
        ));
        let other = f
            .admit("v", Some(&t("u2", 9)), Call::Other)
            .expect_err("owned");
        assert!(
            other.to_string().contains("owned by live lifecycle u1"),
            "{other}"
        );

        let ended = f.end(Some(t("u1", 5)));
        assert_eq!(
            ended
                .admit("v", Some(&t("u1", 5)), Call::Delete)
                .map(|x| x.1),
            Ok(Admission::RepeatsDelete)
        );
        assert!(matches!(
            ended.admit("v", Some(&t("u1", 6)), Call::Delete),
            Err(FenceError::Ended { .. })
        ));
        assert!(matches!(
            ended.admit("v", Some(&t("u1", 5)), Call::Other),
            Err(FenceError::Ended { .. })
        ));
        let stale = ended
            .admit("v", Some(&t("u1", 9)), Call::Other)
            .expect_err("ended");
        assert!(
            stale.to_string().starts_with("stale fencing token"),
            "{stale}"
        );
        let (reopened, a) = ended
            .admit("v", Some(&t("u2", 1)), Call::Other)
            .expect("new lifecycle");
        assert_eq!(a, Admission::Opens);
        assert!(reopened.ended_uids.contains("u1"));

        let released = f.end(None);
        assert!(matches!(
            released.admit("v", Some(&t("u1", 5)), Call::Delete),
            Err(FenceError::Ended { .. })
        ));
    }
}
