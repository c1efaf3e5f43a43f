//! The building blocks the model files share: projections (dense, [`linear`]; quantized,
//! [`quantized`]; through the few-row kernel, `kernel`), norms, the rotary embedding.

mod kernel;
pub mod linear;
pub mod norm;
pub mod quantized;
pub mod rotary;

pub use kernel::kernel_product_dense;
pub use linear::{Linear, Weight, WeightLayout};
pub use norm::Rounding;
pub(crate) use norm::{qk_norm_in_place, rms_norm};
pub use quantized::{Packed, Quantize, Quantized};
pub use rotary::Rope;
pub(crate) use rotary::rope_in_place;
