//! What Agora's servers and clients share on the network: the accept
//! loop every listener runs ([`serve`]) with the bounds it keeps on
//! peers ([`Limits`], [`conn`]), bounded reading of request bodies
//! ([`body`]) and of WebSocket messages (`gate`), and TLS settings ([`tls`]).

pub mod auth;
pub mod body;
pub mod conn;
pub mod doors;
mod gate;
pub mod limits;
pub mod serve;
pub mod stats;
pub mod tls;

pub use body::{Bodies, BodyError};
pub use conn::Connection;
pub use doors::OpenDoor;
pub use limits::{LimitFlags, Limits};
pub use serve::{serve, ServeOptions};
pub use stats::NetStats;
pub use tls::{LocalPki, ServerTls, TlsError, TlsFlags, TlsOptions};
