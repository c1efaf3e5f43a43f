//! The small const-built values the rules and their messages carry: suggested sizes
//! ([`SizeList`], [`divisors`]), names copied into fixed buffers ([`ShortStr`]), and exact
//! arithmetic helpers ([`exact_product`], [`str_eq`]).

use crate::msg::Msg;

/// Byte-wise string equality usable in `const fn`.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        // cannot fire: i < a.len() == b.len()
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `n * factor` when it is a whole number, or `None`.
///
/// Never rounded to a neighbour: the whole part is the truncation transformers takes
/// (`int(head_dim * factor)`), and it counts only when the product exceeds it by no more
/// than float noise (1e-9 relative). So 16 * 0.3 = 4.8 is not whole, while 3 * (2/3 written
/// as 0.666666666667) is 2, as transformers also computes it.
pub const fn exact_product(n: u64, factor: f64) -> Option<u64> {
    let r = n as f64 * factor;
    if r.is_nan() || r < 0.0 || r > 9.0e15 {
        return None;
    }
    let w = r as u64; // cannot fire: 0 <= r <= 9e15 was checked, so the cast is exact
    let excess = r - w as f64;
    let tolerance = if r > 1.0 { r * 1e-9 } else { 1e-9 };
    if excess <= tolerance { Some(w) } else { None }
}

/// Capacity of a [`SizeList`].
pub const SIZE_LIST_CAPACITY: usize = 24;

/// A short list of suggested numbers, built in `const fn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeList {
    items: [u64; SIZE_LIST_CAPACITY],
    len: usize,
    more: bool,
}

impl SizeList {
    pub const fn new() -> Self {
        SizeList { items: [0; SIZE_LIST_CAPACITY], len: 0, more: false }
    }
    pub const fn with(mut self, v: u64) -> Self {
        if self.len < SIZE_LIST_CAPACITY {
            self.items[self.len] = v;
            self.len += 1;
        } else {
            self.more = true;
        }
        self
    }
    pub const fn as_slice(&self) -> &[u64] {
        self.items.split_at(self.len).0
    }
    /// Whether more values existed than the list holds.
    pub const fn has_more(&self) -> bool {
        self.more
    }
    pub(crate) const fn write(&self, m: Msg) -> Msg {
        let m = m.list(self.as_slice());
        if self.more { m.push(", ...") } else { m }
    }
}

impl Default for SizeList {
    fn default() -> Self {
        SizeList::new()
    }
}

/// Divisors are searched up to this (so up to its square, 2^40, every divisor is found).
pub const DIVISOR_SEARCH_LIMIT: u64 = 1 << 20;

/// The divisors of `n` in increasing order, the first [`SIZE_LIST_CAPACITY`] of them (empty
/// when `n` is 0). Pairs `d`, `n / d` are found together, so at most `sqrt(n)` candidates are
/// tried, and never more than [`DIVISOR_SEARCH_LIMIT`]: beyond that the list holds the
/// divisors found and is marked as having more.
pub const fn divisors(n: u64) -> SizeList {
    let mut small = SizeList::new();
    if n == 0 {
        return small;
    }
    let mut d = 1;
    // d <= n / d is d * d <= n without overflow.
    while d <= n / d {
        if d > DIVISOR_SEARCH_LIMIT {
            small.more = true;
            return small;
        }
        if n.is_multiple_of(d) {
            small = small.with(d);
            if small.more {
                // Full: larger divisors would not be listed anyway.
                return small;
            }
        }
        d += 1;
    }
    // `small` holds every divisor up to sqrt(n); the others are n / d, increasing as d falls.
    let mut out = small;
    let mut i = small.len;
    while i > 0 {
        i -= 1;
        let d = small.items[i]; // cannot fire: i < small.len <= SIZE_LIST_CAPACITY
        if n / d != d {
            out = out.with(n / d);
        }
    }
    out
}

/// A name copied into a fixed buffer, so an error can carry it in `const fn`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ShortStr {
    buf: [u8; 40],
    len: usize,
}

impl ShortStr {
    pub const fn new(s: &str) -> Self {
        let b = s.as_bytes();
        let mut buf = [0u8; 40];
        let mut len = 0;
        while len < b.len() && len < 40 {
            buf[len] = b[len];
            len += 1;
        }
        // Never end inside a multi-byte character.
        while len > 0 && len < b.len() && (b[len] & 0xC0) == 0x80 {
            len -= 1;
        }
        ShortStr { buf, len }
    }
    pub const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.buf.split_at(self.len).0) {
            Ok(s) => s,
            Err(_) => "?",
        }
    }
}

impl core::fmt::Debug for ShortStr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}
