//! The limits of one batch: how many actions, how much text, how long, how
//! many images. Plain numbers, checked by [`super::validate()`].

/// Most actions in one batch.
pub const MAX_ACTIONS: usize = 100;
/// Longest `text` of one action, in bytes of UTF-8.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Longest `duration` of one `wait` or `hold_key`, in seconds.
pub const MAX_DURATION_SECS: f64 = 30.0;
/// Longest sum of the durations of one batch, in seconds: a batch must end
/// well within a client's patience and the broker's request bound.
pub const MAX_BATCH_DURATION_SECS: f64 = 60.0;
/// Most bytes of text of one batch, all its `text` fields together: the
/// batch must fit one guest-socket message ([`crate::MAX_HEADER_LEN`])
/// whatever its escaping, and its typing must end within the bounds.
pub const MAX_BATCH_TEXT_BYTES: usize = 96 * 1024;
/// Most `screenshot` and `zoom` actions of one batch: their images are held
/// together until the batch answers.
pub const MAX_IMAGES: usize = 10;
/// Most wheel clicks of one `scroll`.
pub const MAX_SCROLL_AMOUNT: u32 = 100;
/// Most keys of one combination (`ctrl+shift+alt+t` is 4) and most
/// combinations of one `key` text (`ctrl+a Delete` is 2).
pub const MAX_KEYS: usize = 16;
/// Largest width or height of `scale` (and of any screen this code maps).
pub const MAX_SIDE: u32 = 16_384;
/// Longest clipboard text of `clipboard_set` and `clipboard_get`, in bytes
/// of UTF-8: a batch and its answer each travel as one guest-socket message
/// ([`crate::MAX_HEADER_LEN`]), whose JSON may escape a byte as six.
pub const MAX_CLIPBOARD_BYTES: usize = 32 * 1024;
/// Most `clipboard_get` actions of one batch (their texts share the answer's
/// message).
pub const MAX_CLIPBOARD_GETS: usize = 1;
