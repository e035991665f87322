//! Conversations with the server core ([`silt_mqtt::server::Connection`]) in virtual time: a
//! client made of the codec and flow types, a fake broker executing the core's requests, no
//! sockets and no sleeps. Loss is simulated by dropping packets on their way to the client.

mod harness;

mod handshake;
mod inbound;
mod lifecycle;
mod limits;
mod outbound;
mod reasons;
mod subscribe;
