//! The keyboard mapping as the X server has it now, and temporary bindings of
//! keysyms to spare keycodes.
//!
//! Owns reading the core mapping (`GetKeyboardMapping`, `GetModifierMapping`),
//! finding which keycode and shift level give a keysym, and binding keysyms
//! the layout lacks to keycodes that carry nothing (`ChangeKeyboardMapping`).
//! It must never rewrite a keycode that carries a keysym or sits in the
//! modifier map (a core rewrite of such a key can lose what XKB knows about
//! it), and every binding it makes is undone by [`Keymap::restore`].

use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{ConnectionExt as _, Keycode};
use x11rb::rust_connection::RustConnection;

use crate::x_client::XError;

/// Keysyms of the keypad block (`KP_Space` … `KP_Equal`): their second
/// column depends on Num Lock, so typing never uses them.
const KEYPAD: std::ops::RangeInclusive<u32> = 0xff80..=0xffbd;

/// Where a keysym is: its keycode and whether Shift must be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyAt {
    /// The keycode to press.
    pub keycode: Keycode,
    /// Whether Shift (level 2) is needed.
    pub shift: bool,
}

/// A snapshot of the core keyboard mapping plus the bindings made since.
#[derive(Debug)]
pub struct Keymap {
    min: Keycode,
    per: usize,
    syms: Vec<u32>,
    /// Keycodes in the modifier map, by modifier (Shift, Lock, Control,
    /// Mod1..Mod5).
    modifiers: Vec<Vec<Keycode>>,
    /// Keycodes that carried nothing when the snapshot was taken.
    spare: Vec<Keycode>,
    /// Spare keycodes bound now: keycode, level (0, or 1 with Shift), keysym.
    bound: Vec<(Keycode, u8, u32)>,
    /// Spare keycodes whose binding may take a second keysym at level 2.
    two_level: Vec<Keycode>,
    /// Whether bindings were made since the last [`Keymap::flush`].
    dirty: bool,
}

impl Keymap {
    /// Reads the current mapping (two round trips).
    pub fn load(conn: &RustConnection) -> Result<Self, XError> {
        let setup = conn.setup();
        let (min, max) = (setup.min_keycode, setup.max_keycode);
        if max < min {
            return Err(XError::Unexpected(format!("keycodes {min}..={max}")));
        }
        let count = max - min + 1;
        let mapping = conn.get_keyboard_mapping(min, count)?;
        let modmap = conn.get_modifier_mapping()?;
        let mapping = mapping.reply()?;
        let modmap = modmap.reply()?;
        let per = usize::from(mapping.keysyms_per_keycode);
        if per == 0 || mapping.keysyms.len() != per * usize::from(count) {
            return Err(XError::Unexpected(format!(
                "keyboard mapping of {} keysyms for {count} keycodes × {per}",
                mapping.keysyms.len()
            )));
        }
        let width = modmap.keycodes.len() / 8;
        let modifiers: Vec<Vec<Keycode>> = (0..8)
            .map(|m| {
                modmap
                    .keycodes
                    .iter()
                    .skip(m * width)
                    .take(width)
                    .copied()
                    .filter(|k| *k != 0)
                    .collect()
            })
            .collect();
        let in_modmap = |k: Keycode| modifiers.iter().any(|row| row.contains(&k));
        let spare = (min..=max)
            .filter(|k| {
                let i = usize::from(k - min) * per;
                mapping.keysyms[i..i + per].iter().all(|s| *s == 0) && !in_modmap(*k)
            })
            .collect();
        Ok(Self {
            min,
            per,
            syms: mapping.keysyms,
            modifiers,
            spare,
            bound: Vec::new(),
            two_level: Vec::new(),
            dirty: false,
        })
    }

    fn column(&self, keycode: Keycode, col: usize) -> u32 {
        let Some(i) = keycode.checked_sub(self.min) else {
            return 0;
        };
        self.syms
            .get(usize::from(i) * self.per + col)
            .copied()
            .unwrap_or(0)
    }

    fn keycodes(&self) -> impl Iterator<Item = Keycode> + '_ {
        let count = self.syms.len() / self.per;
        (0..count).filter_map(move |i| u8::try_from(i).ok().and_then(|i| self.min.checked_add(i)))
    }

    /// Where the layout has `keysym` without modifiers, or with Shift only
    /// when `allow_shift`; keypad keys are skipped. Bindings come first.
    pub fn find(&self, keysym: u32, allow_shift: bool) -> Option<KeyAt> {
        if let Some(at) = self.find_bound(keysym, allow_shift) {
            return Some(at);
        }
        let usable = |k: Keycode| !KEYPAD.contains(&self.column(k, 0));
        if let Some(keycode) = self
            .keycodes()
            .find(|k| usable(*k) && self.column(*k, 0) == keysym)
        {
            return Some(KeyAt {
                keycode,
                shift: false,
            });
        }
        if allow_shift && self.per >= 2 {
            if let Some(keycode) = self
                .keycodes()
                .find(|k| usable(*k) && self.column(*k, 1) == keysym)
            {
                return Some(KeyAt {
                    keycode,
                    shift: true,
                });
            }
        }
        None
    }

    /// A keycode of modifier `index` (0 Shift, 1 Lock, 2 Control, 3..=7
    /// Mod1..Mod5).
    pub fn modifier_keycode(&self, index: usize) -> Option<Keycode> {
        self.modifiers
            .get(index)
            .and_then(|row| row.first().copied())
    }

    /// Whether `keycode` is in the modifier map.
    pub fn is_modifier(&self, keycode: Keycode) -> bool {
        self.modifiers.iter().any(|row| row.contains(&keycode))
    }

    /// How many keycodes can be bound at once (each holds two keysyms
    /// when Shift may be used, see [`Keymap::bind`]).
    pub fn spare_count(&self) -> usize {
        self.spare.len()
    }

    /// Binds `keysym` to a spare keycode (sent at the next
    /// [`Keymap::flush`]); `None` when every spare place is taken. With
    /// `two_levels`, a keycode holds two keysyms, the second typed with
    /// Shift; without, a bound keycode types its keysym whatever modifiers
    /// are held (both levels carry it), and only free keycodes are used.
    pub fn bind(&mut self, keysym: u32, two_levels: bool) -> Option<KeyAt> {
        if let Some(at) = self.find_bound(keysym, two_levels) {
            return Some(at);
        }
        let used = |k: &Keycode| self.bound.iter().filter(|(b, _, _)| b == k).count();
        let (keycode, level) = match self.spare.iter().find(|k| used(k) == 0) {
            Some(k) => (*k, 0),
            None if two_levels => {
                // A keycode bound at level 0 by a two-level binding.
                let k = self.spare.iter().find(|k| {
                    used(k) == 1
                        && self.bound.iter().any(|(b, l, _)| b == *k && *l == 0)
                        && self.two_level.contains(k)
                })?;
                (*k, 1)
            }
            None => return None,
        };
        if level == 0 && two_levels {
            self.two_level.push(keycode);
        }
        self.bound.push((keycode, level, keysym));
        self.dirty = true;
        Some(KeyAt {
            keycode,
            shift: level == 1,
        })
    }

    fn find_bound(&self, keysym: u32, allow_shift: bool) -> Option<KeyAt> {
        self.bound
            .iter()
            .find(|(_, l, s)| *s == keysym && (*l == 0 || allow_shift))
            .map(|(k, l, _)| KeyAt {
                keycode: *k,
                shift: *l == 1,
            })
    }

    /// Whether any binding is in place.
    pub fn has_bindings(&self) -> bool {
        !self.bound.is_empty()
    }

    /// Sends the pending bindings, one request per run of consecutive spare
    /// keycodes, and waits for the server to have applied them (one round
    /// trip), so no key is pressed before its keysym is there. Answers
    /// whether anything was sent.
    pub fn flush(&mut self, conn: &RustConnection) -> Result<bool, XError> {
        if !self.dirty {
            return Ok(false);
        }
        let bound = self.bound.clone();
        self.write(conn, |k| {
            let level = |l: u8| {
                bound
                    .iter()
                    .find(|(b, bl, _)| *b == k && *bl == l)
                    .map(|(_, _, s)| *s)
            };
            let first = level(0)?;
            Some([first, level(1).unwrap_or(first)])
        })?;
        conn.get_input_focus()?.reply()?;
        self.dirty = false;
        Ok(true)
    }

    /// Undoes every binding. The caller first makes sure the clients have
    /// handled the keys sent with them: a client reads the mapping when it
    /// handles its change notice, and one that does so before handling the
    /// keys queued ahead of it reads them as nothing.
    pub fn restore(&mut self, conn: &RustConnection) -> Result<(), XError> {
        if self.bound.is_empty() {
            return Ok(());
        }
        let bound: Vec<Keycode> = self.bound.iter().map(|(k, _, _)| *k).collect();
        self.write(conn, |k| bound.contains(&k).then_some([0, 0]))?;
        conn.get_input_focus()?.reply()?;
        self.bound.clear();
        self.two_level.clear();
        self.dirty = false;
        Ok(())
    }

    /// Writes the keycodes for which `sym` answers, in runs of consecutive
    /// keycodes: `[level 1, level 2, 0, …]` per keycode (the same keysym
    /// twice for a one-level binding, so Shift and Caps Lock make no
    /// difference on it).
    fn write(
        &self,
        conn: &RustConnection,
        sym: impl Fn(Keycode) -> Option<[u32; 2]>,
    ) -> Result<(), XError> {
        let per = self.per.max(2);
        let per_u8 =
            u8::try_from(per).map_err(|_| XError::Unexpected("keysyms per keycode".into()))?;
        let mut keycodes: Vec<(Keycode, [u32; 2])> = self
            .spare
            .iter()
            .filter_map(|k| sym(*k).map(|s| (*k, s)))
            .collect();
        keycodes.sort_unstable();
        let mut i = 0;
        while i < keycodes.len() {
            let first = keycodes[i].0;
            let mut run = vec![];
            while let Some((k, s)) = keycodes.get(i) {
                if usize::from(*k) != usize::from(first) + run.len() / per {
                    break;
                }
                let mut row = vec![0u32; per];
                row[0] = s[0];
                row[1] = s[1];
                run.extend(row);
                i += 1;
            }
            let count = u8::try_from(run.len() / per)
                .map_err(|_| XError::Unexpected("keycode run".into()))?;
            conn.change_keyboard_mapping(count, first, per_u8, &run)?;
        }
        Ok(())
    }
}
