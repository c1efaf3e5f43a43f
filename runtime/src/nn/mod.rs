//! The building blocks the model files share: projections, norms, the rotary embedding.

pub mod linear;
pub mod norm;
pub mod rotary;

pub use linear::{Linear, Packed, Quantize, WeightLayout, kernel_product_dense};
pub use norm::Rounding;
pub(crate) use norm::{qk_norm_in_place, rms_norm};
pub use rotary::Rope;
pub(crate) use rotary::rope_in_place;
