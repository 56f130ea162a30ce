//! One delivery from the lane to its settlement: consume, look up, sign, send, decide, settle.

pub mod dispatch;
pub mod egress;
pub mod endpoint;
pub mod http;
pub mod lane;
pub mod route;
pub mod settle;
pub mod signing;
pub mod subscriptions;
pub mod worker;
