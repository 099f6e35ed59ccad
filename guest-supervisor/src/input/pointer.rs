//! The pointer on the display: moves, clicks, drags and the waits until the
//! server has the pointer where it was sent and its buttons released. It
//! never sends keys but the held modifiers it is given.

use super::*;

/// Longest wait for the server's pointer to reach the last point sent.
/// While a client holds a synchronous grab (openbox's click-to-focus grab
/// on every managed window), the server freezes the pointer on a press and
/// queues the events behind it until that client lets them go, so a
/// position asked for right after a click can be the click's, not the
/// later move's. Openbox lets go within milliseconds, except right after a
/// keyboard mapping change (a layout switch, or the bindings typing
/// makes), which it handles first: 100–300 ms seen on a quiet host, over
/// 3 s with the whole test suite running beside it. A pointer someone else
/// moves meanwhile (a person on a control screen) makes the wait run out.
pub(super) const POINTER_BOUND: Duration = Duration::from_secs(10);

/// Pause between the clicks of a double or triple click. A toolkit counts
/// a click as a repeat only when its press carries a later server
/// timestamp than the previous one (Chromium ignores equal ones as one
/// native event), and clicks sent back to back share a millisecond.
pub(super) const MULTI_CLICK_GAP: Duration = Duration::from_millis(20);

/// Steps of the pointer's path between the ends of a drag: applications
/// start a drag only after motion with the button held.
pub(super) const DRAG_STEPS: i64 = 8;

/// Whether the action presses a mouse button (the wheel aside).
pub(super) fn presses_a_button(name: ActionName) -> bool {
    matches!(
        name,
        ActionName::LeftMouseDown
            | ActionName::LeftClick
            | ActionName::LeftClickDrag
            | ActionName::RightClick
            | ActionName::MiddleClick
            | ActionName::DoubleClick
            | ActionName::TripleClick
    )
}

impl Runner<'_> {
    pub(super) fn click(
        &mut self,
        held: &[KeyAt],
        at: Option<actions::Coordinate>,
        button: u8,
        times: u32,
    ) -> Result<(), ActionError> {
        self.with_held(held, |r| {
            r.move_opt(at)?;
            for i in 0..times {
                if i > 0 {
                    r.sync()?;
                    std::thread::sleep(MULTI_CLICK_GAP);
                }
                r.button(button, true)?;
                r.button(button, false)?;
            }
            r.buttons_released()
        })
    }

    /// Waits until the server has processed the button releases sent: while
    /// the window manager's click-to-focus grab holds the pointer frozen,
    /// pointer events queue but key events do not, so modifiers released
    /// (or keys pressed) right after a click would reach the client before
    /// the click itself (a shift-click arriving without Shift). Bounded by
    /// [`POINTER_BOUND`].
    pub(super) fn buttons_released(&mut self) -> Result<(), ActionError> {
        const BUTTONS: u16 = 0x1f00;
        self.pointer_until(|p| u16::from(p.mask) & BUTTONS == 0)
            .map(drop)
    }

    /// Asks the server for the pointer until `done` holds or
    /// [`POINTER_BOUND`] passed; answers the last reply.
    pub(super) fn pointer_until(
        &mut self,
        done: impl Fn(&xproto::QueryPointerReply) -> bool,
    ) -> Result<xproto::QueryPointerReply, ActionError> {
        let deadline = std::time::Instant::now() + POINTER_BOUND;
        loop {
            let p = self
                .conn
                .query_pointer(self.root)
                .map_err(XError::from)?
                .reply()
                .map_err(XError::from)?;
            if done(&p) || std::time::Instant::now() >= deadline {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub(super) fn move_opt(&mut self, at: Option<actions::Coordinate>) -> Result<(), ActionError> {
        match at {
            Some(at) => self.move_to(at),
            None => Ok(()),
        }
    }

    pub(super) fn move_to(&mut self, at: actions::Coordinate) -> Result<(), ActionError> {
        let [x, y] = self.space.to_screen(at);
        let x = i16::try_from(x).map_err(|_| XError::Unexpected(format!("x {x}")))?;
        let y = i16::try_from(y).map_err(|_| XError::Unexpected(format!("y {y}")))?;
        self.conn
            .xtest_fake_input(xproto::MOTION_NOTIFY_EVENT, 0, 0, self.root, x, y, 0)
            .map_err(XError::from)?;
        self.pointer = Some((x, y));
        Ok(())
    }

    /// Where the server has the pointer, once it is where it was last sent
    /// (or [`POINTER_BOUND`] passed: then where it is, frozen or moved by
    /// someone else).
    pub(super) fn pointer_settled(&mut self) -> Result<(i16, i16), ActionError> {
        let sent = self.pointer;
        let p = self.pointer_until(|p| sent.is_none_or(|s| s == (p.root_x, p.root_y)))?;
        Ok((p.root_x, p.root_y))
    }

    pub(super) fn button(&mut self, button: u8, press: bool) -> Result<(), ActionError> {
        let kind = if press {
            xproto::BUTTON_PRESS_EVENT
        } else {
            xproto::BUTTON_RELEASE_EVENT
        };
        self.conn
            .xtest_fake_input(kind, button, 0, self.root, 0, 0, 0)
            .map_err(XError::from)?;
        Ok(())
    }

    /// Before keys that follow a click in the same batch: a click moves the
    /// keyboard focus (between windows, or inside a page) only once the
    /// client has handled it, and keys sent before that go where the focus
    /// was (Chromium sent keys typed right after a click into the element
    /// focused before it, 4 times in 6). Waits until the focused client
    /// answered a ping queued behind the click (0 in 8 misplaced), or
    /// `options.settle` for a client that cannot be pinged.
    pub(super) fn hand_over_click(&mut self) -> Result<(), ActionError> {
        self.sync()?;
        if !self.ping_focus()? {
            std::thread::sleep(self.options.settle);
        }
        Ok(())
    }
}
