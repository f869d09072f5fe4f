//! The CLI's one error type of its own: bad input, caught before anything
//! is sent, which `main` prints as one sentence and exits 2 for (the code
//! clap uses for its own parse errors).

use std::fmt;

/// Bad input caught before anything was sent; exits with status 2 like clap's own errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub(crate) fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}
