//! One-token attention over a paged KV cache, reading each key and value where its block
//! lies in the pool: a decode step's attention without first gathering every row's keys
//! into one tensor (a copy measured at three times the attention itself; the paged cache
//! entry of docs/SERVING.md).
//!
//! Each (row, kv head) is one task on the model's CPU threads: the head's query heads score
//! every key the row holds (f32 products), a softmax per query head, then the weighted sum
//! of the values; each key and value is read once for the whole group. A latent cache
//! (multi-head latent attention, absorbed) is one kv head whose entries are both keys and
//! values. f32 and bf16 caches.

use tch::{Device, Kind, Tensor};

use super::CpuPool;
use super::few_rows::Path;
use crate::error::{Error, Result};

/// Where a one-token step reads each row's keys: `slots[b * keys + p]` is the pool slot of
/// row b's position p, of which it attends to the first `lens[b]`.
pub struct PagedKeys<'a> {
    pub slots: &'a [i64],
    pub keys: usize,
    pub lens: &'a [usize],
}

/// Whether [`attend`] runs on a cache of `kind` on `device`.
pub fn supports(kind: Kind, device: Device) -> bool {
    device == Device::Cpu && matches!(kind, Kind::Float | Kind::BFloat16)
}

/// How a pool holds a layer's keys and values.
#[derive(Clone, Copy, Debug)]
pub enum Entries {
    /// `[1, 2 · kv, slots, D]`: the kv heads' keys, then their values (grouped-query
    /// attention); query head j reads kv head j / (Hq / kv).
    Heads { kv: usize },
    /// `[1, 1, slots, W]`: one latent a position (multi-head latent attention, absorbed),
    /// its first `key` channels the key of every query head and its first `value` channels
    /// the value.
    Latent { key: usize, value: usize },
}

/// `softmax(scale · q · kᵀ) · v` for each row's one query (`q`, `[B, Hq, Dk]`) over the
/// keys `at` gives, from the pool `pool` laid out as `entries` says. Returns `[B, Hq · Dv]`
/// in the pool's kind.
pub fn attend(
    q: &Tensor,
    pool: &Tensor,
    entries: Entries,
    scale: f64,
    at: &PagedKeys,
    threads: &CpuPool,
) -> Result<Tensor> {
    attend_on(q, pool, entries, scale, at, threads, Path::detected())
}

/// [`attend`] with the instructions of `path` (one this CPU runs).
fn attend_on(
    q: &Tensor,
    pool: &Tensor,
    entries: Entries,
    scale: f64,
    at: &PagedKeys,
    threads: &CpuPool,
    path: Path,
) -> Result<Tensor> {
    let (b, hq, dk) = q.size3()?;
    let (b, hq, dk) = (b as usize, hq as usize, dk as usize); // cannot wrap: sizes
    let ps = pool.size();
    let kind = pool.kind();
    let bad = |why: &str| Error::Internal(format!("paged attention over a pool {ps:?} of {kind:?}: {why}"));
    if !supports(kind, pool.device()) || ps.len() != 4 || !pool.is_contiguous() {
        return Err(bad("not a contiguous f32 or bf16 CPU pool"));
    }
    let (heads, width) = (ps[1] as usize, ps[3] as usize); // cannot wrap: sizes
    let (kv, dv, values) = match entries {
        Entries::Heads { kv } if kv > 0 && heads == 2 * kv && dk == width && hq % kv == 0 => (kv, dk, kv),
        Entries::Latent { key, value } if heads == 1 && dk == key && key <= width && value <= key => (1, value, 0),
        _ => return Err(bad(&format!("{entries:?} for queries of {hq} heads of {dk}"))),
    };
    if at.lens.len() != b || at.slots.len() != b * at.keys || at.lens.iter().any(|&l| l > at.keys || l == 0) {
        return Err(bad(&format!("{} slots of {b} rows of {} keys", at.slots.len(), at.keys)));
    }
    let capacity = ps[2];
    if at.slots.iter().any(|&s| s < 0 || s >= capacity) {
        return Err(bad("a slot outside the pool"));
    }
    let qf = Vec::<f32>::try_from(&q.f_to_kind(Kind::Float)?.f_contiguous()?.f_view([-1])?)?;
    let mut out = vec![0f32; b * hq * dv];
    let job = Job {
        q: &qf,
        out: Shared(out.as_mut_ptr()),
        pool: pool.data_ptr() as *const u8,
        bf16: kind == Kind::BFloat16,
        head_stride: capacity as usize * width,
        width,
        kv,
        values,
        group: hq / kv,
        dk,
        dv,
        at,
        scale: scale as f32,
    };
    let tasks = b * kv;
    let blocks = threads.threads().min(tasks).max(1);
    threads.run(blocks, &|block| {
        for task in (block * tasks / blocks)..((block + 1) * tasks / blocks) {
            job.run(task, path);
        }
    })?;
    let out = Tensor::f_from_slice(&out)?.f_view([b as i64, (hq * dv) as i64])?;
    Ok(if kind == Kind::Float { out } else { out.f_to_kind(kind)? })
}

/// The output buffer, written by the tasks at disjoint places.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: every task writes only its own (row, kv head)'s query heads of the buffer, and
// `attend` keeps it alive until every task has run.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// One step's operands.
struct Job<'a> {
    q: &'a [f32],
    out: Shared,
    /// The pool's first element: f32, or bf16 as u16.
    pool: *const u8,
    bf16: bool,
    /// Elements between two heads of the pool, and between two of its slots.
    head_stride: usize,
    width: usize,
    kv: usize,
    /// The head of kv head 0's values (`kv`, or 0 when they are the keys' first channels).
    values: usize,
    group: usize,
    dk: usize,
    dv: usize,
    at: &'a PagedKeys<'a>,
    scale: f32,
}

// SAFETY: the pool is only read, and outlives the step (`attend` holds it).
unsafe impl Sync for Job<'_> {}

impl Job<'_> {
    fn run(&self, task: usize, path: Path) {
        #[cfg(target_arch = "x86_64")]
        if path != Path::Plain {
            // SAFETY: `Path::detected` found AVX2 and FMA on this CPU.
            unsafe { self.run_avx2(task) };
            return;
        }
        let _ = path;
        self.run_any(task);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(&self, task: usize) {
        self.run_any(task);
    }

    /// Row `task / kv`, kv head `task % kv`.
    #[inline(always)]
    fn run_any(&self, task: usize) {
        if self.bf16 {
            self.head::<u16>(task);
        } else {
            self.head::<f32>(task);
        }
    }

    #[inline(always)]
    fn head<E: Elem>(&self, task: usize) {
        let (row, h) = (task / self.kv, task % self.kv);
        let (g, dk, dv) = (self.group, self.dk, self.dv);
        let len = self.at.lens[row];
        let slots = &self.at.slots[row * self.at.keys..row * self.at.keys + len];
        let hq = self.kv * g;
        let q = &self.q[(row * hq + h * g) * dk..(row * hq + (h + 1) * g) * dk];
        let pool = self.pool as *const E;
        // SAFETY: `attend` checked every slot against the pool's, and the heads and widths
        // against its shape; an entry is `n <= width` elements from its start.
        let entry = |head: usize, slot: i64, n: usize| -> &[E] {
            unsafe { std::slice::from_raw_parts(pool.add(head * self.head_stride + slot as usize * self.width), n) }
        };
        let mut scores = vec![0f32; g * len];
        for (p, &slot) in slots.iter().enumerate() {
            let k = entry(h, slot, dk);
            for i in 0..g {
                scores[i * len + p] = dot(&q[i * dk..(i + 1) * dk], k) * self.scale;
            }
        }
        for s in scores.chunks_exact_mut(len) {
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in s.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            let inv = sum.recip();
            s.iter_mut().for_each(|x| *x *= inv);
        }
        let mut acc = vec![0f32; g * dv];
        for (p, &slot) in slots.iter().enumerate() {
            let v = entry(self.values + h, slot, dv);
            for i in 0..g {
                axpy(&mut acc[i * dv..(i + 1) * dv], scores[i * len + p], v);
            }
        }
        // SAFETY: this task's query heads of its row, written by no other task.
        let out = unsafe { std::slice::from_raw_parts_mut(self.out.0.add((row * hq + h * g) * dv), g * dv) };
        out.copy_from_slice(&acc);
    }
}

/// A cache element read as f32.
trait Elem: Copy {
    fn f32(self) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl Elem for u16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

/// `Σ a·b`, eight partial sums (the compiler keeps them in one vector register).
#[inline(always)]
fn dot<E: Elem>(a: &[f32], b: &[E]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for j in 0..8 {
            acc[j] += x[j] * y[j].f32();
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ar.iter().zip(br) {
        s += x * y.f32();
    }
    s
}

/// `y += w·x`.
#[inline(always)]
fn axpy<E: Elem>(y: &mut [f32], w: f32, x: &[E]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += w * b.f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against libtorch's attention over the same keys gathered, in f32 and bf16, on every
    /// path this CPU runs (rows of different lengths, keys in scattered slots).
    #[test]
    fn paged_attention_equals_attention_over_the_gathered_keys() {
        tch::manual_seed(3);
        let (b, hq, kv, d, slots) = (3usize, 8usize, 2usize, 64usize, 96i64);
        let lens = [37usize, 5, 64];
        let keys = 64usize;
        // Row r's position p at slot (p * 7 + r * 13) % slots: scattered, distinct in a row.
        let at: Vec<i64> = (0..b).flat_map(|r| (0..keys).map(move |p| ((p * 7 + r * 13) % 96) as i64)).collect();
        for kind in [Kind::Float, Kind::BFloat16] {
            let pool = Tensor::randn([1, 2 * kv as i64, slots, d as i64], (Kind::Float, Device::Cpu)).to_kind(kind);
            let q = Tensor::randn([b as i64, hq as i64, d as i64], (Kind::Float, Device::Cpu)).to_kind(kind);
            let read = Tensor::from_slice(&at);
            let gathered =
                pool.select(0, 0).index_select(1, &read).view([2 * kv as i64, b as i64, keys as i64, d as i64]);
            let gathered = gathered.permute([1, 0, 2, 3]).to_kind(Kind::Float);
            let (k, v) = (gathered.narrow(1, 0, kv as i64), gathered.narrow(1, kv as i64, kv as i64));
            let g = (hq / kv) as i64;
            let qg = q.to_kind(Kind::Float).view([b as i64, kv as i64, g, d as i64]);
            let pos = Tensor::arange(keys as i64, (Kind::Int64, Device::Cpu)).unsqueeze(0);
            let len = Tensor::from_slice(&lens.map(|l| l as i64)).unsqueeze(1);
            let mask = Tensor::zeros([b as i64, keys as i64], (Kind::Float, Device::Cpu))
                .masked_fill(&pos.ge_tensor(&len), f64::NEG_INFINITY)
                .view([b as i64, 1, 1, keys as i64]);
            let want = Tensor::scaled_dot_product_attention(&qg, &k, &v, Some(&mask), 0.0, false, None, false)
                .reshape([b as i64, (hq * d) as i64]);
            let threads = CpuPool::new(2);
            for path in Path::available() {
                let at = PagedKeys { slots: &at, keys, lens: &lens };
                let scale = (d as f64).powf(-0.5);
                let got = attend_on(&q, &pool, Entries::Heads { kv }, scale, &at, &threads, path).unwrap();
                assert_eq!(got.kind(), kind);
                let diff = (got.to_kind(Kind::Float) - &want).abs().max().double_value(&[]);
                // bf16: the output's rounding (8 bits of mantissa of values below 4).
                let tol = if kind == Kind::Float { 1e-5 } else { 2e-2 };
                assert!(diff <= tol, "{kind:?} on {path:?}: {diff}");
            }
        }
    }

    /// A latent pool (one entry a position, wider than the key: a sparse layer's indexer
    /// key after it): every query head against the entries' first `key` channels, values
    /// their first `value`, at a given scale; against libtorch's attention over them
    /// gathered.
    #[test]
    fn paged_latent_attention_equals_attention_over_the_gathered_latents() {
        tch::manual_seed(4);
        let (b, hq, key, value, width, slots, keys) = (2usize, 5usize, 40usize, 32usize, 48i64, 50i64, 30usize);
        let lens = [30usize, 11];
        let at: Vec<i64> = (0..b).flat_map(|r| (0..keys).map(move |p| ((p * 11 + r * 3) % 50) as i64)).collect();
        let pool = Tensor::randn([1, 1, slots, width], (Kind::Float, Device::Cpu));
        let q = Tensor::randn([b as i64, hq as i64, key as i64], (Kind::Float, Device::Cpu));
        let gathered =
            pool.select(0, 0).index_select(1, &Tensor::from_slice(&at)).view([1, b as i64, keys as i64, width]);
        let gathered = gathered.permute([1, 0, 2, 3]); // [B, 1, keys, W]
        let pos = Tensor::arange(keys as i64, (Kind::Int64, Device::Cpu)).unsqueeze(0);
        let len = Tensor::from_slice(&lens.map(|l| l as i64)).unsqueeze(1);
        let mask = Tensor::zeros([b as i64, keys as i64], (Kind::Float, Device::Cpu))
            .masked_fill(&pos.ge_tensor(&len), f64::NEG_INFINITY)
            .view([b as i64, 1, 1, keys as i64]);
        let (k, v) = (gathered.narrow(3, 0, key as i64), gathered.narrow(3, 0, value as i64));
        let want =
            Tensor::scaled_dot_product_attention(&q.unsqueeze(1), &k, &v, Some(&mask), 0.0, false, Some(0.3), false)
                .reshape([b as i64, (hq * value) as i64]);
        let threads = CpuPool::new(2);
        for path in Path::available() {
            let at = PagedKeys { slots: &at, keys, lens: &lens };
            let got = attend_on(&q, &pool, Entries::Latent { key, value }, 0.3, &at, &threads, path).unwrap();
            let diff = (got - &want).abs().max().double_value(&[]);
            assert!(diff <= 1e-5, "{path:?}: {diff}");
        }
    }
}
