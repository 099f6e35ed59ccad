//! The capability registry: which screen capabilities exist, what each
//! allows, and the revocation signal every open connection of one listens to.
//!
//! It owns the token digests (SHA-256 of 256 random bits; the token itself is
//! returned once at mint time and never kept), their expiry, and revocation
//! (one capability, all of a computer, or the control capabilities of an
//! older lease generation). It must never log or store a token, compare
//! digests in variable time, or decide on its own whether a computer may be
//! watched: admission (running, ready, fenced) is the owner's call, made
//! before [`ScreenRegistry::mint`].
//!
//! Expiry is checked on every look-up and swept on every call; each
//! connection also carries its deadline, so an expired capability's
//! connections close on time even when nobody calls the registry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use dormouse_protocol::screen::{
    websocket_path, RevokeReason, ScreenGrant, ScreenInfo, ScreenMode, CONTROL_RESERVE,
    MAX_SCREEN_CONNECTIONS, MAX_SCREEN_TTL_MS, MIN_SCREEN_TTL_MS,
};
use rand::RngCore;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use crate::secret::SecretDigest;

/// Live capabilities one computer may have at once (view may hold all but
/// [`CONTROL_RESERVE`] of them).
pub const MAX_SCREENS_PER_COMPUTER: usize = 64;
/// Open connections one capability may have at once.
pub const MAX_CONNECTIONS_PER_SCREEN: usize = 32;
/// Open view connections one computer may have at once: what the guest
/// carries less what is kept for control.
pub const MAX_VIEW_CONNECTIONS: usize = MAX_SCREEN_CONNECTIONS - CONTROL_RESERVE;

/// Why the registry refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// `ttl_ms` outside the allowed range.
    #[error("ttl_ms must be between {MIN_SCREEN_TTL_MS} and {MAX_SCREEN_TTL_MS}")]
    BadTtl,
    /// The computer has all the capabilities of this mode it may have:
    /// [`MAX_SCREENS_PER_COMPUTER`] in all, view all but [`CONTROL_RESERVE`].
    #[error("{}", too_many_screens(*.0))]
    TooManyScreens(ScreenMode),
    /// No such capability (or it expired or was revoked).
    #[error("no such screen capability")]
    NotFound,
    /// Unknown capability, wrong token, or one that stopped working: one
    /// answer for all, so the id alone tells nothing.
    #[error("the screen token is not valid for this screen")]
    BadToken,
    /// The computer's screens were revoked (or its lease changed hands)
    /// between admission and mint: admit again.
    #[error("the desktop's state changed while the capability was minted; try again")]
    Raced,
    /// The capability has [`MAX_CONNECTIONS_PER_SCREEN`] open connections.
    #[error("this screen capability already has {MAX_CONNECTIONS_PER_SCREEN} connections")]
    TooManyConnections,
    /// The desktop's screen carries all the connections of this mode it
    /// can: [`MAX_SCREEN_CONNECTIONS`] in all, view all but
    /// [`CONTROL_RESERVE`].
    #[error("{}", screen_full(*.0))]
    ScreenFull(ScreenMode),
}

fn too_many_screens(mode: ScreenMode) -> String {
    match mode {
        ScreenMode::View => format!(
            "this computer already has {} live view capabilities, the most it may have \
             ({CONTROL_RESERVE} of its {MAX_SCREENS_PER_COMPUTER} are kept for control)",
            MAX_SCREENS_PER_COMPUTER - CONTROL_RESERVE
        ),
        ScreenMode::Control => {
            format!("this computer already has {MAX_SCREENS_PER_COMPUTER} live screen capabilities")
        }
    }
}

/// Short enough for a WebSocket close reason (123 bytes).
fn screen_full(mode: ScreenMode) -> String {
    match mode {
        ScreenMode::View => format!(
            "screen full: {MAX_VIEW_CONNECTIONS} view connections open ({CONTROL_RESERVE} kept for control)"
        ),
        ScreenMode::Control => {
            format!("screen full: {MAX_SCREEN_CONNECTIONS} connections open, all it carries")
        }
    }
}

/// What a connection is allowed, handed out by [`ScreenRegistry::authorize`].
#[derive(Debug)]
pub struct Ticket {
    /// The capability.
    pub screen_id: Uuid,
    /// The computer whose screen it shows.
    pub computer: Uuid,
    /// What it allows.
    pub mode: ScreenMode,
    /// When it expires (the connection closes then, 4002).
    pub deadline: Instant,
    /// Becomes `Some(reason)` when the capability is revoked; a closed
    /// channel (the entry is gone) means revoked too.
    pub revoked: watch::Receiver<Option<RevokeReason>>,
}

impl Ticket {
    /// The reason, if the capability is already revoked.
    pub fn revoked_now(&self) -> Option<RevokeReason> {
        *self.revoked.borrow()
    }
}

struct Entry {
    computer: Uuid,
    mode: ScreenMode,
    generation: Option<u64>,
    digest: SecretDigest,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    deadline: Instant,
    revoke: watch::Sender<Option<RevokeReason>>,
    reason: Option<String>,
}

impl Entry {
    fn info(&self, screen_id: Uuid) -> ScreenInfo {
        ScreenInfo {
            screen_id,
            computer_id: self.computer,
            mode: self.mode,
            generation: self.generation,
            created_at: self.created_at,
            expires_at: self.expires_at,
            connections: u32::try_from(self.revoke.receiver_count()).unwrap_or(u32::MAX),
            reason: self.reason.clone(),
        }
    }
}

/// A computer's revocation count, read before admission and checked at mint
/// ([`ScreenRegistry::epoch`]), so a revocation that lands between the
/// owner's admission and the mint cannot be missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(u64);

#[derive(Default)]
struct State {
    entries: HashMap<Uuid, Entry>,
    /// Bumped by every revocation of a computer's screens (all, or control
    /// after a generation change). Absent = 0.
    epochs: HashMap<Uuid, u64>,
}

/// Every live screen capability of the broker. Cheap to clone (one shared map).
#[derive(Clone, Default)]
pub struct ScreenRegistry {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for ScreenRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScreenRegistry").finish_non_exhaustive()
    }
}

impl ScreenRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves whole entries behind; the map
        // is still consistent, so take it over.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The computer's current epoch; read it before asking the owner to
    /// admit a capability and pass it to [`mint`](Self::mint).
    pub fn epoch(&self, computer: Uuid) -> Epoch {
        Epoch(self.lock().epochs.get(&computer).copied().unwrap_or(0))
    }

    /// Mints a capability for `computer`. `generation` is the lease
    /// generation a control capability is bound to (the owner has already
    /// checked the caller's fence); it is ignored for `view`. `epoch` is
    /// what [`epoch`](Self::epoch) said before admission; if the computer's
    /// screens were revoked since, the mint is refused with
    /// [`RegistryError::Raced`]. `reason` (checked by
    /// [`CreateScreen::validate`](dormouse_protocol::screen::CreateScreen::validate))
    /// is kept for the list.
    pub fn mint(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        ttl_ms: u64,
        generation: u64,
        epoch: Epoch,
        reason: Option<&str>,
    ) -> Result<ScreenGrant, RegistryError> {
        if !(MIN_SCREEN_TTL_MS..=MAX_SCREEN_TTL_MS).contains(&ttl_ms) {
            return Err(RegistryError::BadTtl);
        }
        let ttl = Duration::from_millis(ttl_ms);
        let mut state = self.lock();
        if state.epochs.get(&computer).copied().unwrap_or(0) != epoch.0 {
            return Err(RegistryError::Raced);
        }
        let entries = &mut state.entries;
        sweep(entries, Instant::now());
        let (views, all) = entries
            .values()
            .filter(|e| e.computer == computer)
            .fold((0, 0), |(v, a), e| {
                (v + usize::from(e.mode == ScreenMode::View), a + 1)
            });
        let full = match mode {
            ScreenMode::View => views >= MAX_SCREENS_PER_COMPUTER - CONTROL_RESERVE,
            ScreenMode::Control => false,
        };
        if full || all >= MAX_SCREENS_PER_COMPUTER {
            return Err(RegistryError::TooManyScreens(mode));
        }
        let mut secret = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut secret);
        let token = hex::encode(secret);
        let screen_id = Uuid::new_v4();
        let created_at = Utc::now();
        let expires_at = created_at
            + chrono::Duration::from_std(ttl).unwrap_or_else(|_| chrono::Duration::days(1));
        let (revoke, _) = watch::channel(None);
        entries.insert(
            screen_id,
            Entry {
                computer,
                mode,
                generation: (mode == ScreenMode::Control).then_some(generation),
                digest: SecretDigest::of(&token),
                created_at,
                expires_at,
                deadline: Instant::now() + ttl,
                revoke,
                reason: reason.map(str::to_owned),
            },
        );
        Ok(ScreenGrant {
            screen_id,
            mode,
            token,
            expires_at,
            websocket: websocket_path(screen_id),
        })
    }

    /// Checks `token` against capability `screen_id` and hands out a ticket
    /// for one connection.
    pub fn authorize(&self, screen_id: Uuid, token: &str) -> Result<Ticket, RegistryError> {
        let entries = &mut self.lock().entries;
        sweep(entries, Instant::now());
        let entry = entries.get(&screen_id).ok_or(RegistryError::BadToken)?;
        if !entry.digest.matches(token) {
            return Err(RegistryError::BadToken);
        }
        if entry.revoke.borrow().is_some() {
            return Err(RegistryError::BadToken);
        }
        if entry.revoke.receiver_count() >= MAX_CONNECTIONS_PER_SCREEN {
            return Err(RegistryError::TooManyConnections);
        }
        // What the desktop's screen carries, every capability together: an
        // open connection holds its ticket's receiver until it closes.
        let (views, all) = entries
            .values()
            .filter(|e| e.computer == entry.computer)
            .fold((0, 0), |(v, a), e| {
                let n = e.revoke.receiver_count();
                (v + if e.mode == ScreenMode::View { n } else { 0 }, a + n)
            });
        let full = match entry.mode {
            ScreenMode::View => views >= MAX_VIEW_CONNECTIONS,
            ScreenMode::Control => false,
        };
        if full || all >= MAX_SCREEN_CONNECTIONS {
            return Err(RegistryError::ScreenFull(entry.mode));
        }
        Ok(Ticket {
            screen_id,
            computer: entry.computer,
            mode: entry.mode,
            deadline: entry.deadline,
            revoked: entry.revoke.subscribe(),
        })
    }

    /// The live capabilities of `computer`, oldest first (never tokens).
    pub fn list(&self, computer: Uuid) -> Vec<ScreenInfo> {
        let entries = &mut self.lock().entries;
        sweep(entries, Instant::now());
        let mut list: Vec<ScreenInfo> = entries
            .iter()
            .filter(|(_, e)| e.computer == computer)
            .map(|(id, e)| e.info(*id))
            .collect();
        list.sort_by_key(|i| (i.created_at, i.screen_id));
        list
    }

    /// The computer a capability belongs to, if it is live.
    pub fn computer_of(&self, screen_id: Uuid) -> Option<Uuid> {
        let entries = &mut self.lock().entries;
        sweep(entries, Instant::now());
        entries.get(&screen_id).map(|e| e.computer)
    }

    /// Revokes one capability: it stops working and its connections close.
    pub fn revoke(&self, screen_id: Uuid, reason: RevokeReason) -> Result<(), RegistryError> {
        let entry = self
            .lock()
            .entries
            .remove(&screen_id)
            .ok_or(RegistryError::NotFound)?;
        signal(&entry, reason);
        Ok(())
    }

    /// Revokes every capability of `computer`; returns how many. Call on
    /// stop, kill, remove and a new container start.
    pub fn revoke_all(&self, computer: Uuid, reason: RevokeReason) -> usize {
        self.bump(computer);
        self.revoke_where(reason, |e| e.computer == computer)
    }

    /// Revokes the control capabilities of `computer` not bound to
    /// `generation`; returns how many. Call whenever the generation changes.
    /// View capabilities are not fenced and stay.
    pub fn revoke_control_except(&self, computer: Uuid, generation: u64) -> usize {
        self.bump(computer);
        self.revoke_where(RevokeReason::GenerationChanged, |e| {
            e.computer == computer
                && e.mode == ScreenMode::Control
                && e.generation != Some(generation)
        })
    }

    /// Revokes everything (broker shutdown).
    pub fn revoke_everything(&self, reason: RevokeReason) -> usize {
        self.revoke_where(reason, |_| true)
    }

    /// Moves the computer's epoch on, so a mint admitted before fails.
    /// Kept after removal too (eight bytes a computer): forgetting it would
    /// let a mint that raced the removal through.
    fn bump(&self, computer: Uuid) {
        let mut state = self.lock();
        let e = state.epochs.entry(computer).or_insert(0);
        *e = e.wrapping_add(1);
    }

    fn revoke_where(&self, reason: RevokeReason, affected: impl Fn(&Entry) -> bool) -> usize {
        let gone: Vec<Entry> = {
            let entries = &mut self.lock().entries;
            let ids: Vec<Uuid> = entries
                .iter()
                .filter(|(_, e)| affected(e))
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| entries.remove(id)).collect()
        };
        for entry in &gone {
            signal(entry, reason);
        }
        gone.len()
    }

    /// Drops expired capabilities and tells their connections; returns how
    /// many. Every call sweeps too; a periodic sweep only frees memory sooner.
    pub fn sweep(&self) -> usize {
        sweep(&mut self.lock().entries, Instant::now())
    }

    /// Runs [`sweep`](Self::sweep) every `every` until the registry is the
    /// `stop` is cancelled.
    pub async fn sweep_every(&self, every: Duration, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => { self.sweep(); }
            }
        }
    }
}

fn signal(entry: &Entry, reason: RevokeReason) {
    // `send_replace` stores the reason even with no receiver, so a ticket
    // handed out a moment before sees it on its first look.
    entry.revoke.send_replace(Some(reason));
}

fn sweep(entries: &mut HashMap<Uuid, Entry>, now: Instant) -> usize {
    let expired: Vec<Uuid> = entries
        .iter()
        .filter(|(_, e)| e.deadline <= now)
        .map(|(id, _)| *id)
        .collect();
    for id in &expired {
        if let Some(entry) = entries.remove(id) {
            signal(&entry, RevokeReason::Expired);
        }
    }
    expired.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;

    #[tokio::test(start_paused = true)]
    async fn a_minted_token_authorizes_only_its_own_screen() {
        let reg = ScreenRegistry::new();
        let a = Uuid::new_v4();
        let b = Uuid::new_v4();
        let ga = reg
            .mint(a, ScreenMode::View, MINUTE, 0, Epoch(0), None)
            .unwrap();
        let gb = reg
            .mint(b, ScreenMode::Control, MINUTE, 7, Epoch(0), None)
            .unwrap();
        assert_eq!(ga.token.len(), 64, "256 bits, hex");
        assert_eq!(ga.websocket, format!("/v1/screens/{}/rfb", ga.screen_id));
        let t = reg.authorize(ga.screen_id, &ga.token).unwrap();
        assert_eq!((t.computer, t.mode), (a, ScreenMode::View));
        // A's token on B's screen, a wrong token, an unknown id: one answer.
        assert_eq!(
            reg.authorize(gb.screen_id, &ga.token).unwrap_err(),
            RegistryError::BadToken
        );
        assert_eq!(
            reg.authorize(ga.screen_id, "0").unwrap_err(),
            RegistryError::BadToken
        );
        assert_eq!(
            reg.authorize(Uuid::new_v4(), &ga.token).unwrap_err(),
            RegistryError::BadToken
        );
        let listed = reg.list(b);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].generation, Some(7));
        assert_eq!(reg.list(a)[0].connections, 1, "the ticket counts");
        drop(t);
        assert_eq!(reg.list(a)[0].connections, 0);
        assert!(
            !serde_json::to_string(&reg.list(a))
                .unwrap()
                .contains(&ga.token),
            "never a token in a list"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_is_bounded() {
        let reg = ScreenRegistry::new();
        let c = Uuid::new_v4();
        assert_eq!(
            reg.mint(c, ScreenMode::View, 999, 0, Epoch(0), None)
                .unwrap_err(),
            RegistryError::BadTtl
        );
        assert_eq!(
            reg.mint(
                c,
                ScreenMode::View,
                MAX_SCREEN_TTL_MS + 1,
                0,
                Epoch(0),
                None
            )
            .unwrap_err(),
            RegistryError::BadTtl
        );
        for _ in 0..MAX_SCREENS_PER_COMPUTER - CONTROL_RESERVE {
            reg.mint(c, ScreenMode::View, MINUTE, 0, Epoch(0), None)
                .unwrap();
        }
        let refused = reg.mint(c, ScreenMode::View, MINUTE, 0, Epoch(0), None);
        assert_eq!(
            refused,
            Err(RegistryError::TooManyScreens(ScreenMode::View))
        );
        // The room kept for control is there, and then all is taken.
        for _ in 0..CONTROL_RESERVE {
            reg.mint(c, ScreenMode::Control, MINUTE, 0, Epoch(0), None)
                .unwrap();
        }
        let refused = reg.mint(c, ScreenMode::Control, MINUTE, 0, Epoch(0), None);
        assert_eq!(
            refused,
            Err(RegistryError::TooManyScreens(ScreenMode::Control))
        );
        reg.mint(Uuid::new_v4(), ScreenMode::View, MINUTE, 0, Epoch(0), None)
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn revocation_reaches_open_tickets_and_refuses_new_ones() {
        let reg = ScreenRegistry::new();
        let c = Uuid::new_v4();
        let other = Uuid::new_v4();
        let g1 = reg
            .mint(c, ScreenMode::View, MINUTE, 0, Epoch(0), None)
            .unwrap();
        let g2 = reg
            .mint(c, ScreenMode::Control, MINUTE, 0, Epoch(0), None)
            .unwrap();
        let g3 = reg
            .mint(other, ScreenMode::View, MINUTE, 0, Epoch(0), None)
            .unwrap();
        let mut t1 = reg.authorize(g1.screen_id, &g1.token).unwrap();
        let mut t2 = reg.authorize(g2.screen_id, &g2.token).unwrap();
        let t3 = reg.authorize(g3.screen_id, &g3.token).unwrap();

        assert_eq!(reg.revoke_all(c, RevokeReason::Stopped), 2);
        t1.revoked.changed().await.unwrap();
        assert_eq!(t1.revoked_now(), Some(RevokeReason::Stopped));
        t2.revoked.changed().await.unwrap();
        assert_eq!(t2.revoked_now(), Some(RevokeReason::Stopped));
        assert_eq!(t3.revoked_now(), None, "another computer is untouched");
        assert_eq!(
            reg.authorize(g1.screen_id, &g1.token).unwrap_err(),
            RegistryError::BadToken
        );
        assert!(reg.list(c).is_empty());

        assert_eq!(reg.revoke(g3.screen_id, RevokeReason::Deleted), Ok(()));
        assert_eq!(t3.revoked_now(), Some(RevokeReason::Deleted));
        assert_eq!(
            reg.revoke(g3.screen_id, RevokeReason::Deleted),
            Err(RegistryError::NotFound)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_generation_change_revokes_only_older_control() {
        let reg = ScreenRegistry::new();
        let c = Uuid::new_v4();
        let view = reg
            .mint(c, ScreenMode::View, MINUTE, 3, Epoch(0), None)
            .unwrap();
        let old = reg
            .mint(c, ScreenMode::Control, MINUTE, 3, Epoch(0), None)
            .unwrap();
        let new = reg
            .mint(c, ScreenMode::Control, MINUTE, 4, Epoch(0), None)
            .unwrap();
        let t = reg.authorize(old.screen_id, &old.token).unwrap();
        assert_eq!(reg.revoke_control_except(c, 4), 1);
        assert_eq!(t.revoked_now(), Some(RevokeReason::GenerationChanged));
        let left: Vec<Uuid> = reg.list(c).iter().map(|i| i.screen_id).collect();
        assert!(left.contains(&view.screen_id) && left.contains(&new.screen_id));
        assert_eq!(left.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_refuses_new_connections_and_is_swept() {
        let reg = ScreenRegistry::new();
        let c = Uuid::new_v4();
        let g = reg
            .mint(c, ScreenMode::View, 5_000, 0, Epoch(0), None)
            .unwrap();
        let t = reg.authorize(g.screen_id, &g.token).unwrap();
        assert_eq!(t.deadline, Instant::now() + Duration::from_secs(5));
        tokio::time::advance(Duration::from_millis(4_999)).await;
        assert!(reg.authorize(g.screen_id, &g.token).is_ok());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            reg.authorize(g.screen_id, &g.token).unwrap_err(),
            RegistryError::BadToken
        );
        assert_eq!(t.revoked_now(), Some(RevokeReason::Expired));
        assert!(reg.list(c).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_tells_connections_of_expired_capabilities() {
        let reg = ScreenRegistry::new();
        let c = Uuid::new_v4();
        let g = reg
            .mint(c, ScreenMode::View, 2_000, 0, Epoch(0), None)
            .unwrap();
        let mut t = reg.authorize(g.screen_id, &g.token).unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let sweeper = tokio::spawn({
            let reg = reg.clone();
            let stop = stop.clone();
            async move { reg.sweep_every(Duration::from_millis(500), stop).await }
        });
        t.revoked.changed().await.unwrap();
        assert_eq!(t.revoked_now(), Some(RevokeReason::Expired));
        stop.cancel();
        sweeper.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_revocation_between_admission_and_mint_refuses_the_mint() {
        let reg = ScreenRegistry::new();
        let c = Uuid::new_v4();
        let before = reg.epoch(c);
        reg.revoke_all(c, RevokeReason::Stopped);
        assert_eq!(
            reg.mint(c, ScreenMode::View, MINUTE, 0, before, None)
                .unwrap_err(),
            RegistryError::Raced
        );
        let before = reg.epoch(c);
        reg.revoke_control_except(c, 9);
        assert_eq!(
            reg.mint(c, ScreenMode::Control, MINUTE, 8, before, None)
                .unwrap_err(),
            RegistryError::Raced
        );
        assert!(reg
            .mint(c, ScreenMode::Control, MINUTE, 9, reg.epoch(c), None)
            .is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn connections_per_capability_are_bounded() {
        let reg = ScreenRegistry::new();
        let g = reg
            .mint(Uuid::new_v4(), ScreenMode::View, MINUTE, 0, Epoch(0), None)
            .unwrap();
        let tickets: Vec<Ticket> = (0..MAX_CONNECTIONS_PER_SCREEN)
            .map(|_| reg.authorize(g.screen_id, &g.token).unwrap())
            .collect();
        assert_eq!(
            reg.authorize(g.screen_id, &g.token).unwrap_err(),
            RegistryError::TooManyConnections
        );
        drop(tickets);
        assert!(reg.authorize(g.screen_id, &g.token).is_ok());
    }

    /// Two view capabilities of 32 connections each would fill the guest's
    /// 64: view stops at 56, the lease holder's control still gets in, and
    /// the desktop never carries more than 64.
    #[tokio::test(start_paused = true)]
    async fn connections_per_computer_match_the_guest_and_keep_room_for_control() {
        let reg = ScreenRegistry::new();
        let c = Uuid::new_v4();
        let mint = |mode| reg.mint(c, mode, MINUTE, 0, Epoch(0), None).unwrap();
        let (v1, v2, ctl) = (
            mint(ScreenMode::View),
            mint(ScreenMode::View),
            mint(ScreenMode::Control),
        );
        let mut open: Vec<Ticket> = (0..MAX_CONNECTIONS_PER_SCREEN)
            .map(|_| reg.authorize(v1.screen_id, &v1.token).unwrap())
            .collect();
        for _ in MAX_CONNECTIONS_PER_SCREEN..MAX_VIEW_CONNECTIONS {
            open.push(reg.authorize(v2.screen_id, &v2.token).unwrap());
        }
        let refused = reg.authorize(v2.screen_id, &v2.token).unwrap_err();
        assert_eq!(refused, RegistryError::ScreenFull(ScreenMode::View));
        assert!(refused.to_string().len() <= 123, "fits a close reason");
        for _ in 0..CONTROL_RESERVE {
            open.push(reg.authorize(ctl.screen_id, &ctl.token).unwrap());
        }
        assert_eq!(open.len(), MAX_SCREEN_CONNECTIONS);
        assert_eq!(
            reg.authorize(ctl.screen_id, &ctl.token).unwrap_err(),
            RegistryError::ScreenFull(ScreenMode::Control)
        );
        open.truncate(MAX_VIEW_CONNECTIONS - 1);
        assert!(reg.authorize(v2.screen_id, &v2.token).is_ok(), "room again");
    }
}
