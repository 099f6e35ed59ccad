//! Shared helpers of the end-to-end tests (see `tests/tests/`).
