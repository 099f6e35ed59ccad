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
