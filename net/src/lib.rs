//! What Agora's servers and clients share on the network: the accept
//! loop every listener runs ([`serve`]) and TLS settings ([`tls`]).

pub mod auth;
pub mod doors;
pub mod serve;
pub mod tls;

pub use doors::OpenDoor;
pub use serve::{serve, ServeOptions};
pub use tls::{LocalPki, ServerTls, TlsError, TlsFlags, TlsOptions};
