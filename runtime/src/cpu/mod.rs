//! CPU execution a model owns: its worker threads and their scratch buffer ([`CpuPool`]),
//! the few-row kernel that runs decode's products on them ([`few_rows`]), column-split
//! weights ([`columns`]), and the narrowing of libtorch's threads on one calling thread
//! ([`threads`]).

pub mod columns;
pub mod few_rows;
pub mod paged_attention;
mod pool;
pub mod threads;

pub use pool::CpuPool;
