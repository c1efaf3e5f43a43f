//! The caches generation runs over, as components the engine (`crate::engine`) composes:
//! the rows of a running batch ([`SlotCache`]), its paged block pool and prefix index, the
//! MTP layer's drafting state, the operations rank 0 broadcasts for them; and the padded
//! batch (positions and masks) and static-shape steps of a CUDA graph's decode. The model
//! holds no generation state.

pub(crate) mod batch;
mod drafts;
mod mtp;
mod ops;
mod paged;
mod pages;
mod prefix;
mod prefix_index;
mod rows;
mod slot_drafts;
mod slots;
pub(crate) mod static_decoder;

pub use batch::check_prompts;
pub use mtp::{check_mtp, draft_logits};
pub use pages::PAGE;
pub use prefix_index::{PREFIX_BLOCK, PrefixHit};
pub use slots::SlotCache;
#[cfg(feature = "test-hooks")]
pub use static_decoder::break_next_capture;
