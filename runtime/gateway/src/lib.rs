//! `modelfleet-gateway`: one authenticated OpenAI endpoint for every ModelDeployment in its scope.
//!
//! A request's way through ([`routes`]): the key is checked at the edge before the body is read
//! ([`edge::admit`]); the body is read with a size cap and a deadline; [`request`] peeks at `model`
//! and the affinity inputs (the body itself is forwarded unchanged); the deployment's own tenants
//! decide ([`edge::authorize`]); the tenant's fleet-wide quota is taken ([`edge::Quotas`]); [`proxy`]
//! chooses a pod ([`route`]: consistent hashing with bounded loads over [`ring`], loads from [`load`])
//! — holding the request in [`pending`] while the deployment has no Ready pod, so the operator can
//! scale it from zero — sends it, retries what provably did not reach a pod (and, once, a broken
//! connection to a pod that is still there: [`suspect`]), and streams the answer back; [`record`]
//! accounts for it once.
//!
//! The fleet itself is a snapshot ([`fleet`]) that [`discovery`] rebuilds from watches on
//! ModelDeployments, LoraAdapters and runtime Pods, and from the tenants Secrets ([`secrets`]).
//! [`serve`] ties it together with two bounded listeners and a graceful drain.
//!
//! Invariants: stateless (every replica with the same pods routes a key to the same pod while loads are
//! within bounds); the tenant comes from the key, never the body; keys and prompts are never logged;
//! nothing is retried once a byte reached the client, nor on another pod once the pod it was sent to
//! went away while handling it; every buffer is bounded (body, headers, error
//! bodies, scrapes, the waiting rooms, connections). The design is in docs/design.md ("Gateway") and
//! docs/gateway.md.

pub mod canary;
pub mod config;
pub mod discovery;
pub mod edge;
pub mod fallback;
pub mod fleet;
pub mod limits;
pub mod load;
pub mod metrics;
pub mod mirror;
pub mod pending;
pub mod provider;
pub mod proxy;
pub mod record;
pub mod refusal;
pub mod request;
pub mod revision;
pub mod ring;
pub mod route;
pub mod routes;
pub mod secrets;
pub mod serve;
pub mod state;
pub mod suspect;
pub mod trace;
pub mod usage;
