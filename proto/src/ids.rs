//! Identifiers. Each is a string on the wire; the newtypes keep a task id
//! from being passed where an agent id is expected.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest id accepted anywhere (ids become path components in sandboxes).
pub const MAX_ID_LEN: usize = 255;

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is the empty string.
    #[error("id must not be empty")]
    Empty,
    /// The id is longer than [`MAX_ID_LEN`] bytes.
    #[error("id is {0} bytes long; the limit is {MAX_ID_LEN}")]
    TooLong(usize),
    /// The id contains a character that is not allowed.
    #[error("id {id:?} contains {ch:?}; allowed are letters, digits and . _ - : @ +")]
    BadChar {
        /// The offending id.
        id: String,
        /// The first character that is not allowed.
        ch: char,
    },
    /// The id is `.` or `..`, which would escape a sandbox path.
    #[error("id {0:?} is reserved")]
    Reserved(String),
}

/// Checks that `id` is usable as an id: non-empty, at most [`MAX_ID_LEN`]
/// bytes, made of ASCII letters, digits and `._-:@+`, and not `.` or `..`.
/// Ids end up in file names, so this is enforced on every id a peer chooses.
pub fn validate_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong(id.len()));
    }
    if id == "." || id == ".." {
        return Err(IdError::Reserved(id.to_string()));
    }
    if let Some(ch) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-:@+".contains(*c)))
    {
        return Err(IdError::BadChar {
            id: id.to_string(),
            ch,
        });
    }
    Ok(())
}

/// The first character of the ids of executors an agent runs on its own
/// account (its command executors): never that of an id a framework
/// chooses, which [`validate_id`] checks.
pub const AGENT_EXECUTOR_PREFIX: char = '~';

/// [`validate_id`] for an executor id, which may also be one of an
/// agent's own executors ([`AGENT_EXECUTOR_PREFIX`] and a valid id).
pub fn validate_executor_id(id: &str) -> Result<(), IdError> {
    validate_id(id.strip_prefix(AGENT_EXECUTOR_PREFIX).unwrap_or(id))
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// Wraps a string as this id type (no validation; see [`validate_id`]).
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Checks the id with [`validate_id`].
            pub fn validate(&self) -> Result<(), IdError> {
                validate_id(&self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.to_string())
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value)
            }
        }
    };
}

id_type!(
    /// A framework, assigned by the master on first subscription.
    FrameworkId
);
id_type!(
    /// An agent, assigned by the master on first registration.
    AgentId
);
id_type!(
    /// An offer, assigned by the master; unique for the master's lifetime.
    OfferId
);
id_type!(
    /// A task, chosen by the framework; unique within the framework.
    TaskId
);
id_type!(
    /// An executor, chosen by the framework (the task id for command tasks);
    /// unique within the framework on one agent.
    ExecutorId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_bad_ids() {
        assert_eq!(validate_id(""), Err(IdError::Empty));
        assert_eq!(validate_id(".."), Err(IdError::Reserved("..".into())));
        assert!(matches!(
            validate_id("a/b"),
            Err(IdError::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            validate_id(&"x".repeat(300)),
            Err(IdError::TooLong(300))
        ));
        assert!(validate_id("task-1.a_b:c@d+e").is_ok());
    }

    #[test]
    fn ids_are_plain_strings_on_the_wire() {
        let id = TaskId::new("t1");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"t1\"");
    }
}
