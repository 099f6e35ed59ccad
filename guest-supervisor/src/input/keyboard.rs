//! Keys on the display: resolving combinations and text to keycodes of the
//! live keymap (binding spare keycodes where the layout has none), pressing
//! and releasing them through XTEST, and settling after them (a
//! `_NET_WM_PING` to the focused client, or a bounded sleep). It never
//! moves the pointer.

use super::*;

/// `Return` and `Tab`.
pub(super) const RETURN: u32 = 0xff0d;
pub(super) const TAB: u32 = 0xff09;

/// Keysyms that make a combination a shortcut: Control, Meta, Alt, Super,
/// Hyper (left and right).
pub(super) const SHORTCUT_MODIFIERS: &[u32] = &[
    0xffe3, 0xffe4, 0xffe7, 0xffe8, 0xffe9, 0xffea, 0xffeb, 0xffec, 0xffed, 0xffee,
];

/// The keycode (evdev numbering, which Xvfb and every current X server
/// use) of an ASCII letter or digit on a US keyboard, and whether it is the
/// shifted one.
pub(super) fn us_position(sym: u32) -> Option<(Keycode, bool)> {
    const ROWS: &[(&[u8], u8)] = &[
        (b"1234567890", 10),
        (b"qwertyuiop", 24),
        (b"asdfghjkl", 38),
        (b"zxcvbnm", 52),
    ];
    let c = u8::try_from(sym).ok()?;
    let (lower, shift) = if c.is_ascii_uppercase() {
        (c.to_ascii_lowercase(), true)
    } else {
        (c, false)
    };
    ROWS.iter().find_map(|(row, first)| {
        let i = row.iter().position(|r| *r == lower)?;
        let i = u8::try_from(i).ok()?;
        Some((first + i, shift))
    })
}

/// Longest wait for the focused client's answer to a ping.
pub(super) const PING_BOUND: Duration = Duration::from_secs(10);

/// Extra settle per key sent, for clients that cannot be pinged.
pub(super) const SETTLE_PER_KEY: Duration = Duration::from_micros(250);

/// Longest settle for clients that cannot be pinged.
pub(super) const SETTLE_MAX: Duration = Duration::from_secs(3);

/// The keysyms that type `text`, one per character: the Unicode-rule
/// keysym and the legacy one a layout may carry instead. `\n` (and `\r\n`,
/// and a lone `\r`) is Return, `\t` is Tab.
pub fn typed_keysyms(text: &str) -> Vec<(u32, Option<u32>)> {
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                (RETURN, None)
            }
            '\n' => (RETURN, None),
            '\t' => (TAB, None),
            c => (keysym::keysym_of_char(c), keysym::legacy_keysym_of_char(c)),
        });
    }
    out
}

impl Runner<'_> {
    pub(super) fn keymap(&mut self) -> Result<&mut Keymap, ActionError> {
        if self.keymap.is_none() {
            self.keymap = Some(Keymap::load(self.conn)?);
        }
        self.keymap
            .as_mut()
            .ok_or_else(|| ActionError::X(XError::Unexpected("keymap".into())))
    }

    /// The keycodes of a modifier combination, bound where needed.
    pub(super) fn combo(&mut self, text: &str) -> Result<Vec<KeyAt>, ActionError> {
        let combo = actions::parse_combo(text).map_err(|p| invalid(ActionName::Key, p))?;
        self.resolve(&combo, text)
    }

    /// Keysyms to keys: those of the layout (level 1, or level 2 with
    /// Shift as xdotool does), the others bound to spare keycodes.
    pub(super) fn resolve(&mut self, combo: &[u32], text: &str) -> Result<Vec<KeyAt>, ActionError> {
        let conn = self.conn;
        let keymap = self.keymap()?;
        let shortcut = combo.iter().any(|s| SHORTCUT_MODIFIERS.contains(s));
        let mut keys = Vec::with_capacity(combo.len());
        for sym in combo {
            let at = match keymap.find(*sym, true) {
                Some(at) => at,
                // A shortcut with a Latin letter or digit the layout lacks
                // (ctrl+a under a Cyrillic layout): the key at that
                // character's place on a US keyboard, as a person presses
                // it; applications match shortcuts by that place.
                None => {
                    match us_position(*sym).filter(|(k, _)| shortcut && !keymap.is_modifier(*k)) {
                        Some((keycode, shift)) => KeyAt { keycode, shift },
                        None => keymap
                            .bind(*sym, false)
                            .ok_or_else(|| ActionError::NoSpareKeycode(text.to_owned()))?,
                    }
                }
            };
            keys.push(at);
        }
        if keymap.flush(conn)? {
            self.settle()?;
        }
        Ok(keys)
    }

    pub(super) fn shift_keycode(&mut self) -> Result<Keycode, ActionError> {
        self.keymap()?
            .modifier_keycode(0)
            .ok_or(ActionError::NoModifierKey("Shift"))
    }

    pub(super) fn press_all(&mut self, keys: &[KeyAt]) -> Result<(), ActionError> {
        let shift = if keys.iter().any(|k| k.shift) {
            Some(self.shift_keycode()?)
        } else {
            None
        };
        for k in keys {
            if k.shift {
                if let Some(s) = shift.filter(|s| !keys.iter().any(|o| o.keycode == *s)) {
                    self.key(s, true)?;
                }
            }
            self.key(k.keycode, true)?;
            self.keys_since_settle = self.keys_since_settle.saturating_add(1);
        }
        Ok(())
    }

    pub(super) fn release_all(&mut self, keys: &[KeyAt]) -> Result<(), ActionError> {
        let shift = if keys.iter().any(|k| k.shift) {
            Some(self.shift_keycode()?)
        } else {
            None
        };
        for k in keys.iter().rev() {
            self.key(k.keycode, false)?;
        }
        if let Some(s) = shift.filter(|s| !keys.iter().any(|o| o.keycode == *s)) {
            self.key(s, false)?;
        }
        Ok(())
    }

    /// Runs `f` with `held` pressed, releasing them even when `f` fails.
    pub(super) fn with_held(
        &mut self,
        held: &[KeyAt],
        f: impl FnOnce(&mut Self) -> Result<(), ActionError>,
    ) -> Result<(), ActionError> {
        self.press_all(held)?;
        let done = f(self);
        let released = self.release_all(held);
        done.and(released)
    }

    pub(super) fn key(&mut self, keycode: Keycode, press: bool) -> Result<(), ActionError> {
        let kind = if press {
            xproto::KEY_PRESS_EVENT
        } else {
            xproto::KEY_RELEASE_EVENT
        };
        self.conn
            .xtest_fake_input(kind, keycode, 0, self.root, 0, 0, 0)
            .map_err(XError::from)?;
        Ok(())
    }

    /// Waits until the client with the keyboard focus has handled all input
    /// and mapping changes sent so far: a `_NET_WM_PING` sent now is queued
    /// behind them, so its answer says so (bounded by [`PING_BOUND`]). A
    /// client without the ping protocol (or without an answer) gets
    /// `options.settle` plus [`SETTLE_PER_KEY`] for every key pressed since
    /// the last settle: a client that lags behind lags in proportion to
    /// what it was sent (capped at [`SETTLE_MAX`]).
    pub(super) fn settle(&mut self) -> Result<(), ActionError> {
        let backlog = std::mem::take(&mut self.keys_since_settle);
        if !self.ping_focus()? {
            let extra = SETTLE_PER_KEY.saturating_mul(backlog);
            std::thread::sleep((self.options.settle + extra).min(SETTLE_MAX));
        }
        Ok(())
    }

    pub(super) fn ping_focus(&mut self) -> Result<bool, ActionError> {
        let conn = self.conn;
        let (protocols, ping) = match self.ping_atoms {
            Some(atoms) => atoms,
            None => {
                let atoms = (
                    x_client::atom(conn, b"WM_PROTOCOLS")?,
                    x_client::atom(conn, b"_NET_WM_PING")?,
                );
                // Answers go to the root window, to those who listen there.
                conn.change_window_attributes(
                    self.root,
                    &xproto::ChangeWindowAttributesAux::new()
                        .event_mask(xproto::EventMask::SUBSTRUCTURE_NOTIFY),
                )
                .map_err(XError::from)?;
                self.ping_atoms = Some(atoms);
                atoms
            }
        };
        let Some(target) = self.ping_target(protocols, ping)? else {
            return Ok(false);
        };
        self.pings = self.pings.wrapping_add(1);
        // A timestamp of its own, so another client's answers do not count.
        let stamp = 0x444d_0000 | (self.pings & 0xffff);
        let message =
            xproto::ClientMessageEvent::new(32, target, protocols, [ping, stamp, target, 0, 0]);
        conn.send_event(false, target, xproto::EventMask::NO_EVENT, message)
            .map_err(XError::from)?;
        conn.flush().map_err(XError::from)?;
        let deadline = std::time::Instant::now() + PING_BOUND;
        loop {
            match conn.poll_for_event().map_err(XError::from)? {
                Some(Event::ClientMessage(m)) if m.type_ == protocols => {
                    let data = m.data.as_data32();
                    if data[0] == ping && data[1] == stamp {
                        return Ok(true);
                    }
                }
                Some(_) => {}
                None if std::time::Instant::now() >= deadline => return Ok(false),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    /// The window that takes the keyboard now and speaks `_NET_WM_PING`:
    /// the focus window or one of its ancestors; with the focus following
    /// the pointer, the windows under the pointer.
    pub(super) fn ping_target(
        &self,
        protocols: u32,
        ping: u32,
    ) -> Result<Option<u32>, ActionError> {
        let conn = self.conn;
        let speaks_ping = |w: u32| -> Result<bool, ActionError> {
            let reply = conn
                .get_property(false, w, protocols, xproto::AtomEnum::ATOM, 0, 64)
                .map_err(XError::from)?
                .reply();
            Ok(match reply {
                Ok(r) => r.value32().is_some_and(|mut v| v.any(|a| a == ping)),
                // The window went away meanwhile.
                Err(_) => false,
            })
        };
        let focus = conn
            .get_input_focus()
            .map_err(XError::from)?
            .reply()
            .map_err(XError::from)?
            .focus;
        let mut candidates = Vec::new();
        if focus > 1 && focus != self.root {
            // Up from the focus window.
            let mut w = focus;
            for _ in 0..32 {
                if w == 0 || w == self.root {
                    break;
                }
                candidates.push(w);
                w = match conn.query_tree(w).map_err(XError::from)?.reply() {
                    Ok(t) => t.parent,
                    Err(_) => break,
                };
            }
        } else {
            // Down along the pointer.
            let mut w = self.root;
            for _ in 0..32 {
                let child = match conn.query_pointer(w).map_err(XError::from)?.reply() {
                    Ok(p) => p.child,
                    Err(_) => break,
                };
                if child == 0 {
                    break;
                }
                candidates.push(child);
                w = child;
            }
        }
        for w in candidates {
            if speaks_ping(w)? {
                return Ok(Some(w));
            }
        }
        Ok(None)
    }

    /// Types `text` exactly: each character from the layout where it has
    /// it at level 1 or 2, otherwise bound to a spare keycode; as many
    /// characters per chunk as there are spare keycodes, each chunk bound
    /// in one go and confirmed by a round trip before its keys are sent.
    pub(super) fn type_text(&mut self, text: &str) -> Result<(), ActionError> {
        let pointer = self
            .conn
            .query_pointer(self.root)
            .map_err(XError::from)?
            .reply()
            .map_err(XError::from)?;
        let mask = u16::from(pointer.mask);
        let shortcut = u16::from(KeyButMask::CONTROL | KeyButMask::MOD1 | KeyButMask::MOD4);
        if mask & shortcut != 0 {
            return Err(ActionError::ModifiersActive(mask & shortcut));
        }
        // Shift, Caps Lock, a level-3 or level-5 latch or another group
        // change what the layout's keys type: then every character goes
        // through a binding, which types the same whatever is held.
        let level_changers =
            u16::from(KeyButMask::SHIFT | KeyButMask::LOCK | KeyButMask::MOD3 | KeyButMask::MOD5)
                | 0x6000;
        let plain = mask & level_changers == 0;
        let chars = typed_keysyms(text);
        let shift = self.keymap()?.modifier_keycode(0);
        let mut i = 0;
        while i < chars.len() {
            let mut chunk: Vec<KeyAt> = Vec::new();
            {
                let keymap = self.keymap()?;
                while let Some((primary, legacy)) = chars.get(i).copied() {
                    let found = if plain {
                        keymap
                            .find(primary, shift.is_some())
                            .or_else(|| legacy.and_then(|l| keymap.find(l, shift.is_some())))
                    } else {
                        None
                    };
                    // Two keysyms per spare keycode when Shift types
                    // as the layout says (nothing else is held).
                    let two_levels = plain && shift.is_some();
                    match found.or_else(|| keymap.bind(primary, two_levels)) {
                        Some(at) => chunk.push(at),
                        None => break,
                    }
                    i += 1;
                }
            }
            if chunk.is_empty() {
                let c = keysym::char_of_keysym(chars.get(i).map_or(0, |c| c.0));
                return Err(ActionError::NoSpareKeycode(
                    c.map(String::from).unwrap_or_default(),
                ));
            }
            let conn = self.conn;
            if self.keymap()?.flush(conn)? {
                self.settle()?;
            }
            for at in &chunk {
                let keys = [*at];
                self.press_all(&keys)?;
                self.release_all(&keys)?;
                if !self.options.char_delay.is_zero() {
                    self.sync()?;
                    std::thread::sleep(self.options.char_delay);
                }
            }
            self.sync()?;
            if i < chars.len() {
                self.settle()?;
                self.keymap()?.restore(conn)?;
            }
        }
        Ok(())
    }
}
