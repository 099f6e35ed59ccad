//! Egress for Dormouse desktops: the decision, the dial and the relay of
//! every connection a guest asks the broker for, under the desktop's
//! policy, with its caps and its audit.
//!
//! The guest has no network interface. Its supervisor's proxy hands each
//! connection to the broker over the guest channel, naming a host and a
//! port; this crate decides ([`decide`]) on the name and on every address
//! the broker itself resolved ([`resolve`]), dials only an address it
//! checked, relays bytes both ways ([`relay`]) until either side closes,
//! the idle timeout passes, the desktop is fenced or a policy change
//! denies the connection, and records each one ([`audit`]). A socket the
//! guest hands over is shared with it, so it is only ever read and written
//! without waiting ([`dormouse_protocol::splice::HandedSocket`]) and closed
//! off the runtime ([`closer`]). It links
//! neither the engine's client nor the HTTP server: the broker gives it a
//! stream and a policy and is told what happened.

#![forbid(unsafe_code)]

pub mod audit;
pub mod closer;
pub mod decide;
pub mod limits;
pub mod policies;
pub mod ranges;
pub mod relay;
pub mod resolve;
pub mod service;

pub use closer::{ClosePool, Closer};
pub use limits::Caps;
pub use policies::Policies;
pub use relay::{GuestStream, Open, Verdict};
pub use service::{run_pool, Desk, Egress, Hooks, Parker};
