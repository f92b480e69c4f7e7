//! The machine protocol core, shared by the agent and the fleet simulator.
//!
//! It does no IO: no sockets, no files, no clocks of its own, no logging.
//! Its functions and small state machines decide what to send (register and
//! heartbeat requests), how to react to an answer (directives, assignment
//! notices, config answers) and when a config bundle is stale. The agent
//! (`agent/`) and the simulator (`simulate/`) do the IO around it, so both
//! follow the same rules; nothing here imports either of them.

pub mod assignment;
pub mod config;
pub mod coordinators;
pub mod datagram;
pub mod directives;
pub mod heartbeat;
pub mod paths;
pub mod register;
pub mod report;
pub mod timing;
