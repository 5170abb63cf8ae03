//! Open doors: the ways into a process that its configuration leaves
//! unguarded (no TLS, a kind of peer not authenticated). Each process
//! lists its own, warns of each at start and names them in `/health`
//! (`open_doors`), so an insecure setup is loud rather than silent.

/// One way in that is not guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenDoor {
    /// Its name in `/health`'s `open_doors`, e.g. `unauthenticated_agents`.
    pub name: &'static str,
    /// What it lets anyone do, and the flag that closes it.
    pub warning: &'static str,
}

/// The names of `doors`, for `/health`.
pub fn names(doors: &[OpenDoor]) -> Vec<&'static str> {
    doors.iter().map(|d| d.name).collect()
}

/// Logs a warning for each of `doors` (once, at start).
pub fn warn(doors: &[OpenDoor]) {
    for door in doors {
        tracing::warn!(open_door = %door.name, "{}", door.warning);
    }
}
