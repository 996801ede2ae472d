//! Engine II: what lets one replica serve many tenants at once — continuous batching over the paged
//! KV cache with tenant-scoped prefix caching, fair admission and preemption — in vLLM v1's layering
//! (scheduler → KV-cache manager → block pool).
//!
//! - [`request`]: the request going in and the events coming out.
//! - [`admission`]: the synchronous gate that bounds what may wait (429 instead of an unbounded queue).
//! - [`fair_queue`]: per-tenant queues, priorities within a tenant, token-fair choice between tenants.
//! - [`scheduler`]: one step's batch under the token and sequence budgets, chunked prefill, prefix
//!   reuse, preemption by recompute, deadlines, cancellation.
//! - [`step_loop`]: the thread that owns the engine and the scheduler, and the handle callers use.

pub mod admission;
pub mod fair_queue;
pub mod request;
pub mod scheduler;
pub mod step_loop;

pub use admission::{AdmissionGate, QueueLimits, Rejection, TenantLimits};
pub use request::{FIRST_TOKEN_DEADLINE, Finished, Request, RequestEvent, Timings, TokenOut, Usage};
pub use scheduler::{
    AdapterCount, Batch, FinishHook, SchedCounters, ScheduledSeq, Scheduler, SchedulerConfig,
};
pub use step_loop::{EngineHandle, KvPoolInfo, RequestStream, Stats};
