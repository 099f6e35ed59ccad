//! Fencing leases: who may act on a computer, under which generation.
//!
//! A lease is kept inside the computer record, so the generation it carries
//! is persisted (atomically, fsynced) *before* the grant is returned and only
//! ever grows across restarts. The rules are pure functions of the record and
//! the clock, so they are tested without any I/O; the owner task applies them.

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use serde::{Deserialize, Serialize};

/// Longest lease a holder may ask for in one request.
pub const MAX_TTL_MS: u64 = 24 * 3600 * 1000;
/// Longest holder name.
pub const MAX_HOLDER_LEN: usize = 200;

/// The lease on one computer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Who holds it.
    pub holder: String,
    /// When it lapses unless renewed.
    pub expires_at: DateTime<Utc>,
    /// The generation it was granted under.
    pub generation: u64,
}

impl Lease {
    /// Whether it still holds at `now`.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        now < self.expires_at
    }
}

/// Why a lease request or a fenced call is refused. The broker's error
/// carries each as its own refusal ([`crate::error::BrokerError`]'s
/// `BadRequest`, `StaleGeneration` and `LeaseHeld`); the checks below are
/// generic over the caller's error type so a caller keeps its own `?`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fenced {
    /// The lease request is malformed; why.
    #[error("{0}")]
    BadRequest(String),
    /// The caller's generation is not the current one.
    #[error("stale generation {given}: the current generation is {current}")]
    StaleGeneration {
        /// What the caller sent.
        given: String,
        /// The current generation.
        current: u64,
    },
    /// A live lease is held and the caller sent no generation.
    #[error("lease held by {holder} until {expires_at}")]
    LeaseHeld {
        /// Current holder.
        holder: String,
        /// RFC 3339 expiry.
        expires_at: String,
    },
}

/// What to do with a lease request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// The live holder renews: same generation, new expiry.
    Renew,
    /// A new holder (or a holder whose lease lapsed) takes over under the next
    /// generation, once nothing of the previous holder is in flight.
    TakeOver,
    /// Someone else holds a live lease.
    Refuse {
        /// The current holder.
        holder: String,
        /// When its lease lapses.
        expires_at: DateTime<Utc>,
    },
}

/// Validates a lease request: a printable holder name and a TTL of at most a day.
pub fn validate_request<E: From<Fenced>>(holder: &str, ttl_ms: u64) -> Result<(), E> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_LEN || holder.chars().any(char::is_control) {
        return Err(Fenced::BadRequest(format!(
            "holder must be 1 to {MAX_HOLDER_LEN} printable characters"
        ))
        .into());
    }
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err(
            Fenced::BadRequest(format!("ttl_ms must be between 1 and {MAX_TTL_MS}")).into(),
        );
    }
    Ok(())
}

/// Decides a lease request by `holder` against the current lease.
pub fn decide(current: Option<&Lease>, holder: &str, now: DateTime<Utc>) -> LeaseDecision {
    match current {
        Some(lease) if lease.is_live(now) && lease.holder == holder => LeaseDecision::Renew,
        Some(lease) if lease.is_live(now) => LeaseDecision::Refuse {
            holder: lease.holder.clone(),
            expires_at: lease.expires_at,
        },
        _ => LeaseDecision::TakeOver,
    }
}

/// The expiry of a lease granted at `now` for `ttl_ms`.
pub fn expiry(now: DateTime<Utc>, ttl_ms: u64) -> DateTime<Utc> {
    let ttl = ChronoDuration::milliseconds(i64::try_from(ttl_ms.min(MAX_TTL_MS)).unwrap_or(0));
    now + ttl
}

/// Checks the generation a mutating call carries.
///
/// - a generation that is not the current one: `stale_generation`;
/// - no generation while a live lease exists: `lease_held`;
/// - otherwise the call may proceed.
pub fn check_fence<E: From<Fenced>>(
    lease: Option<&Lease>,
    generation: u64,
    given: Option<u64>,
    now: DateTime<Utc>,
) -> Result<(), E> {
    match given {
        Some(g) if g != generation => Err(Fenced::StaleGeneration {
            given: g.to_string(),
            current: generation,
        }
        .into()),
        Some(_) => Ok(()),
        None => match lease {
            Some(lease) if lease.is_live(now) => Err(Fenced::LeaseHeld {
                holder: lease.holder.clone(),
                expires_at: lease.expires_at.to_rfc3339(),
            }
            .into()),
            _ => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(
        lease: Option<&Lease>,
        generation: u64,
        given: Option<u64>,
        now: DateTime<Utc>,
    ) -> Result<(), Fenced> {
        check_fence(lease, generation, given, now)
    }

    fn lease(holder: &str, expires_in_ms: i64, generation: u64, now: DateTime<Utc>) -> Lease {
        Lease {
            holder: holder.into(),
            expires_at: now + ChronoDuration::milliseconds(expires_in_ms),
            generation,
        }
    }

    #[test]
    fn no_lease_is_taken_over() {
        assert_eq!(decide(None, "a", Utc::now()), LeaseDecision::TakeOver);
    }

    #[test]
    fn the_live_holder_renews_and_others_are_refused() {
        let now = Utc::now();
        let l = lease("a", 1000, 3, now);
        assert_eq!(decide(Some(&l), "a", now), LeaseDecision::Renew);
        assert!(matches!(
            decide(Some(&l), "b", now),
            LeaseDecision::Refuse { holder, .. } if holder == "a"
        ));
    }

    #[test]
    fn an_expired_lease_is_taken_over_even_by_its_old_holder() {
        let now = Utc::now();
        let l = lease("a", -1, 3, now);
        assert_eq!(decide(Some(&l), "b", now), LeaseDecision::TakeOver);
        assert_eq!(decide(Some(&l), "a", now), LeaseDecision::TakeOver);
        // Expiry is exclusive: at expires_at the lease no longer holds.
        let edge = lease("a", 0, 3, now);
        assert_eq!(decide(Some(&edge), "b", now), LeaseDecision::TakeOver);
    }

    #[test]
    fn stale_generations_are_refused() {
        let now = Utc::now();
        let l = lease("a", 1000, 5, now);
        assert!(matches!(
            fence(Some(&l), 5, Some(4), now),
            Err(Fenced::StaleGeneration { current: 5, .. })
        ));
        assert!(matches!(
            fence(None, 5, Some(6), now),
            Err(Fenced::StaleGeneration { .. })
        ));
        assert_eq!(fence(Some(&l), 5, Some(5), now), Ok(()));
    }

    #[test]
    fn a_live_lease_needs_the_generation() {
        let now = Utc::now();
        let live = lease("a", 1000, 5, now);
        assert!(matches!(
            fence(Some(&live), 5, None, now),
            Err(Fenced::LeaseHeld { .. })
        ));
        let lapsed = lease("a", -1000, 5, now);
        assert_eq!(fence(Some(&lapsed), 5, None, now), Ok(()));
        assert_eq!(fence(None, 0, None, now), Ok(()));
    }

    #[test]
    fn requests_are_validated() {
        assert!(validate_request::<Fenced>("", 1000).is_err());
        assert!(validate_request::<Fenced>("a\nb", 1000).is_err());
        assert!(validate_request::<Fenced>("a", 0).is_err());
        assert!(validate_request::<Fenced>("a", MAX_TTL_MS + 1).is_err());
        assert!(validate_request::<Fenced>("ctl-1", 30_000).is_ok());
    }
}
