//! Parallel execution: ranks as OS processes on torch.distributed (c10d), one per GPU or a
//! share of the CPU's threads, each holding only its part of the model.
//!
//! - [`group`]: process groups (Gloo) and the rendezvous store, a group of one included;
//! - [`world`]: the torchrun environment, this rank's place in `tp x pp`, agreement checks;
//! - [`plan`]: which rows and columns of each weight, and which layers, a rank holds;
//! - [`layers`]: column- and row-parallel projections, the vocabulary-parallel embedding and
//!   lm_head, which communicate inside;
//! - [`launch`]: starting the ranks of a run on this machine, and ending them together.
//!
//! docs/PARALLEL.md describes the plan, the launch on one and several machines, and faults.

pub mod group;
pub mod launch;
pub mod layers;
pub mod plan;
pub mod world;

pub use group::ProcessGroup;
pub use plan::ShardPlan;
pub use world::{Parallel, RankEnv, Timeouts};
