//! Comparison of presented secrets (the broker's API token, screen
//! capability tokens) with the ones the broker accepts.
//!
//! Only a SHA-256 digest of a secret is kept, so a comparison runs over
//! fixed-length values whatever the presented secret's length, and without
//! an early exit, so its time does not tell how many leading bytes matched.
//! It must never log, show or keep a secret itself.

use sha2::{Digest, Sha256};

/// The SHA-256 digest of a secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SecretDigest([u8; 32]);

impl std::fmt::Debug for SecretDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretDigest(..)")
    }
}

impl SecretDigest {
    /// The digest of `secret`.
    pub fn of(secret: &str) -> Self {
        Self(Sha256::digest(secret.as_bytes()).into())
    }

    /// Whether `presented` is the secret, in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq(&self.0, &Self::of(presented).0)
    }
}

/// Compares without an early exit.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secret_matches() {
        let d = SecretDigest::of("s3cret");
        assert!(d.matches("s3cret"));
        assert!(!d.matches("s3cre"));
        assert!(!d.matches("s3cret "));
        assert!(!d.matches(""));
        assert!(!SecretDigest::of("").matches("x"));
        assert!(SecretDigest::of("").matches(""));
    }

    #[test]
    fn debug_never_shows_the_digest() {
        assert_eq!(format!("{:?}", SecretDigest::of("x")), "SecretDigest(..)");
    }
}
