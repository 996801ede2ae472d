//! The OpenAI-compatible HTTP API: strict request parsing ([`wire`]) and the one error mapping
//! ([`error`]). The handlers, SSE streaming and the admission seam to the engine arrive with the runtime
//! server issue.

pub mod error;
pub mod response;
pub mod wire;
