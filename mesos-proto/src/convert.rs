//! Translation between mesos.v1 messages and agora-proto types.
