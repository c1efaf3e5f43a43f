//! A fixed-capacity text buffer that `const fn` code can write into.
//!
//! Rule messages are rendered by one `const fn` so that the derive macro, the generated
//! `const` assertions (evaluated by the compiler) and `Config::validate` at run time print
//! exactly the same words.

/// Capacity of one rendered message, in bytes. Longer text is cut at a character boundary
/// and ends in `...`.
pub const MSG_CAPACITY: usize = 1024;

/// How [`Msg`] rounds the last of twelve significant digits.
#[derive(Clone, Copy)]
enum Round {
    Nearest,
    /// Up, unless twelve digits hold the value (then exactly those digits).
    UpUnlessShort,
    Up,
}

/// A message being written by `const fn` code.
#[derive(Clone, Copy)]
pub struct Msg {
    buf: [u8; MSG_CAPACITY],
    len: usize,
    truncated: bool,
}

impl Msg {
    /// An empty message.
    pub const fn new() -> Self {
        Msg { buf: [0; MSG_CAPACITY], len: 0, truncated: false }
    }

    /// Appends a string.
    pub const fn push(mut self, s: &str) -> Self {
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if self.len + 3 >= MSG_CAPACITY {
                self.truncated = true;
                break;
            }
            self.buf[self.len] = bytes[i]; // cannot fire: len + 3 < MSG_CAPACITY and i < bytes.len()
            self.len += 1;
            i += 1;
        }
        self
    }

    /// Appends an unsigned integer in decimal.
    pub const fn num(mut self, mut v: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            // cannot fire: a u64 has at most 20 digits; v % 10 < 10 fits a u8.
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        while n > 0 {
            n -= 1;
            if self.len + 3 >= MSG_CAPACITY {
                self.truncated = true;
                break;
            }
            self.buf[self.len] = digits[n]; // cannot fire: checked against MSG_CAPACITY above
            self.len += 1;
        }
        self
    }

    /// Appends a float the way a person writes it: up to twelve significant digits,
    /// trailing zeros dropped, scientific notation for very large or small magnitudes.
    pub const fn float(self, v: f64) -> Self {
        self.float_rounded(v, Round::Nearest)
    }

    /// Like [`Msg::float`], but the last printed digit is rounded up (away from zero), so the
    /// printed number is never below `v`: a suggested value stays legal when copied back.
    pub const fn float_up(self, v: f64) -> Self {
        self.float_rounded(v, Round::UpUnlessShort)
    }

    /// Like [`Msg::float_up`], but rounds up even a value that twelve digits hold exactly.
    pub const fn float_above(self, v: f64) -> Self {
        self.float_rounded(v, Round::Up)
    }

    const fn float_rounded(self, v: f64, round: Round) -> Self {
        const DIGITS: usize = 12;
        if v.is_nan() {
            return self.push("NaN");
        }
        if v == f64::INFINITY {
            return self.push("inf");
        }
        if v == f64::NEG_INFINITY {
            return self.push("-inf");
        }
        let mut m = self;
        let mut x = v;
        if x < 0.0 {
            m = m.push("-");
            x = -x;
        }
        if x == 0.0 {
            return m.push("0");
        }
        // Scale into [1, 10) to find the decimal exponent.
        let mut exp: i32 = 0;
        let mut s = x;
        while s >= 10.0 {
            s /= 10.0;
            exp += 1;
        }
        while s < 1.0 {
            s *= 10.0;
            exp -= 1;
        }
        // Twelve significant digits, rounded.
        let scaled = s * 1e11;
        // cannot fire: s is in [1, 10), so scaled and scaled + 0.5 are below 1e12 (no wrap).
        let whole = scaled as u64;
        let mut sig = match round {
            Round::Nearest => (scaled + 0.5) as u64,
            Round::UpUnlessShort if scaled - (whole as f64) < 1e-3 => whole,
            Round::UpUnlessShort => whole + 1,
            // One unit above the nearest: at least half a unit above v, whatever the
            // scaling above lost.
            Round::Up => (scaled + 0.5) as u64 + 1,
        };
        if sig >= 1_000_000_000_000 {
            sig /= 10;
            exp += 1;
        }
        let mut digits = [0u8; DIGITS];
        let mut i = DIGITS;
        while i > 0 {
            i -= 1;
            digits[i] = b'0' + (sig % 10) as u8;
            sig /= 10;
        }
        let mut last = DIGITS;
        while last > 1 && digits[last - 1] == b'0' {
            last -= 1;
        }
        if exp >= -5 && exp < 16 {
            if exp >= 0 {
                let int_digits = exp as usize + 1; // cannot fire: 0 <= exp < 16 here
                let mut k = 0;
                while k < int_digits {
                    m = m.byte(if k < DIGITS { digits[k] } else { b'0' });
                    k += 1;
                }
                if last > int_digits {
                    m = m.byte(b'.');
                    while k < last {
                        m = m.byte(digits[k]);
                        k += 1;
                    }
                }
            } else {
                m = m.push("0.");
                let mut z = 1;
                while z < -exp {
                    m = m.byte(b'0');
                    z += 1;
                }
                let mut k = 0;
                while k < last {
                    m = m.byte(digits[k]);
                    k += 1;
                }
            }
            m
        } else {
            m = m.byte(digits[0]);
            if last > 1 {
                m = m.byte(b'.');
                let mut k = 1;
                while k < last {
                    m = m.byte(digits[k]);
                    k += 1;
                }
            }
            m = m.push("e");
            if exp < 0 {
                m = m.push("-");
                exp = -exp;
            }
            m.num(exp as u64) // cannot fire: exp was made non-negative above
        }
    }

    /// Appends a comma-separated list of numbers.
    pub const fn list(mut self, items: &[u64]) -> Self {
        let mut i = 0;
        while i < items.len() {
            if i > 0 {
                self = self.push(", ");
            }
            self = self.num(items[i]);
            i += 1;
        }
        self
    }

    const fn byte(mut self, b: u8) -> Self {
        if self.len + 3 >= MSG_CAPACITY {
            self.truncated = true;
            return self;
        }
        self.buf[self.len] = b;
        self.len += 1;
        self
    }

    /// The text written so far.
    pub const fn as_str(&self) -> &str {
        // Cut back to a character boundary if a multi-byte character was split.
        let mut len = self.len;
        while len > 0 && (self.buf[len - 1] & 0xC0) == 0x80 {
            len -= 1;
        }
        if len > 0 && self.buf[len - 1] >= 0xC0 {
            len -= 1;
        }
        let (head, _) = self.buf.split_at(len);
        match core::str::from_utf8(head) {
            Ok(s) => s,
            Err(_) => "<message not valid utf-8>",
        }
    }

    /// Whether text was cut because the buffer was full.
    pub const fn is_truncated(&self) -> bool {
        self.truncated
    }
}

impl Default for Msg {
    fn default() -> Self {
        Msg::new()
    }
}

impl core::fmt::Display for Msg {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())?;
        if self.truncated {
            f.write_str("...")?;
        }
        Ok(())
    }
}

impl core::fmt::Debug for Msg {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::Msg;

    fn f(v: f64) -> String {
        Msg::new().float(v).as_str().to_owned()
    }

    #[test]
    fn floats_read_like_literals() {
        assert_eq!(f(0.5), "0.5");
        assert_eq!(f(0.3), "0.3");
        assert_eq!(f(1.0), "1");
        assert_eq!(f(10000.0), "10000");
        assert_eq!(f(1.5625e-7), "1.5625e-7");
        assert_eq!(f(4.8), "4.8");
        assert_eq!(f(-2.0), "-2");
        assert_eq!(f(f64::NAN), "NaN");
        assert_eq!(f(0.001), "0.001");
        assert_eq!(f(1e20), "1e20");
    }

    #[test]
    fn numbers_and_lists() {
        assert_eq!(Msg::new().num(0).as_str(), "0");
        assert_eq!(Msg::new().num(u64::MAX).as_str(), "18446744073709551615");
        assert_eq!(Msg::new().list(&[1, 7]).as_str(), "1, 7");
    }

    #[test]
    fn long_text_is_cut_not_overflowed() {
        let mut m = Msg::new();
        let mut i = 0;
        while i < 2000 {
            m = m.push("é");
            i += 1;
        }
        assert!(m.is_truncated());
        assert!(m.to_string().ends_with("..."));
    }
}
