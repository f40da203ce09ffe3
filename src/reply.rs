//! A reply as plain data, built by pure code and written to the client by `redis::reply`.

use std::borrow::Cow;

use crate::error::Error;

/// What AI.TENSORGET (and a DAG's TENSORGET) replies with: `META`, `BLOB` or `VALUES` (commands/tensor.rs
/// parses it; the reply's layout is in `tensor_reply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GetFormat {
    pub meta: bool,
    pub blob: bool,
    pub values: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Reply<'a> {
    Simple(&'static str),
    Int(i64),
    /// Sent with `RedisModule_ReplyWithDouble`: a bulk string in RESP2, formatted by Redis itself.
    Double(f64),
    Bulk(Cow<'a, [u8]>),
    Array(Vec<Reply<'a>>),
    Null,
    Error(Error),
}

impl<'a> Reply<'a> {
    pub const OK: Reply<'static> = Reply::Simple("OK");

    pub fn str(s: &'a str) -> Reply<'a> {
        Reply::Bulk(Cow::Borrowed(s.as_bytes()))
    }
    pub fn bytes(b: &'a [u8]) -> Reply<'a> {
        Reply::Bulk(Cow::Borrowed(b))
    }
}

/// `d` (finite) as C's `printf("%.17g", d)` writes it: the double replies of Redis before 7.2, and so of RedisAI.
/// Redis 7.0 formats them with `snprintf`, which takes ~0.1 µs per value. The digits are the binary value's,
/// rounded half to even as glibc does; only the layout is `%g`'s.
pub fn format_g17(d: f64, out: &mut [u8; 32]) -> usize {
    let (q, exp) = digits17_exact(d.abs()).unwrap_or_else(|| digits17_fmt(d.abs()));
    let mut digits = [b'0'; 17];
    let mut rest = q;
    for b in digits.iter_mut().rev() {
        *b = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    let trim = |d: &[u8]| d.len() - d.iter().rev().take_while(|&&b| b == b'0').count();

    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        out[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    if d.is_sign_negative() {
        put(b"-");
    }
    if (-4..17).contains(&exp) {
        // Fixed notation with 17 significant digits, trailing zeros (and a bare point) dropped.
        if exp >= 0 {
            let int_len = exp as usize + 1;
            put(&digits[..int_len]);
            let frac = &digits[int_len..];
            if trim(frac) > 0 {
                put(b".");
                put(&frac[..trim(frac)]);
            }
        } else {
            put(b"0.");
            for _ in 0..(-exp - 1) {
                put(b"0");
            }
            put(&digits[..trim(&digits)]);
        }
    } else {
        put(&digits[..1]);
        let frac = &digits[1..];
        if trim(frac) > 0 {
            put(b".");
            put(&frac[..trim(frac)]);
        }
        put(if exp < 0 { b"e-" } else { b"e+" });
        let e = exp.unsigned_abs();
        if e >= 100 {
            put(&[b'0' + (e / 100) as u8]);
        }
        put(&[b'0' + (e / 10 % 10) as u8, b'0' + (e % 10) as u8]);
    }
    n
}

const fn pow_table<const N: usize>(base: u128) -> [u128; N] {
    let mut t = [1u128; N];
    let mut i = 1;
    while i < N {
        t[i] = t[i - 1] * base;
        i += 1;
    }
    t
}
static POW5: [u128; 56] = pow_table(5);
static POW10: [u128; 39] = pow_table(10);

/// The 17 significant digits of `a` (≥ 0, finite) as an integer in [10^16, 10^17) (0 for zero) and the decimal
/// exponent of the first one, with integer arithmetic: `a` = m·2^e = m·5^-e / 10^-e, exact in 128 bits for
/// every integer below 2^74 and for most values of f32 origin (the common tensor values), which Rust's exact
/// formatting would send to its slow bignum path. None when the product does not fit.
fn digits17_exact(a: f64) -> Option<(u64, i32)> {
    let bits = a.to_bits();
    let biased = (bits >> 52) as i32;
    let fraction = bits & ((1 << 52) - 1);
    let (mut m, mut e) = if biased == 0 { (fraction, -1074) } else { (fraction | 1 << 52, biased - 1075) };
    if m == 0 {
        return Some((0, 0));
    }
    let tz = m.trailing_zeros();
    m >>= tz;
    e += tz as i32;
    let (n, k) = if e >= 0 {
        if (64 - m.leading_zeros()) as i32 + e > 127 {
            return None;
        }
        (u128::from(m) << e, 0)
    } else {
        (u128::from(m).checked_mul(*POW5.get(e.unsigned_abs() as usize)?)?, -e)
    };
    let len = POW10.iter().position(|&p| p > n).unwrap_or(POW10.len()) as i32;
    let mut exp = len - 1 - k;
    let q = if len <= 17 {
        (n * POW10[(17 - len) as usize]) as u64
    } else {
        let p = POW10[(len - 17) as usize];
        let (mut q, r) = ((n / p) as u64, n % p);
        if r > p / 2 || (r == p / 2 && q & 1 == 1) {
            q += 1;
        }
        if u128::from(q) == POW10[17] {
            q = POW10[16] as u64;
            exp += 1;
        }
        q
    };
    Some((q, exp))
}

/// `digits17_exact` for any finite `a`, through Rust's exact formatting (which rounds half to even too).
fn digits17_fmt(a: f64) -> (u64, i32) {
    use std::io::Write;
    let mut buf = [0u8; 40];
    let len = {
        let mut w = &mut buf[..];
        // "d.dddddddddddddddde[-]x": 17 significant digits, correctly rounded.
        let _ = write!(w, "{a:.16e}");
        40 - w.len()
    };
    let s = &buf[..len];
    let e = s.iter().position(|&b| b == b'e').unwrap_or(s.len());
    let q = s[..e].iter().filter(|b| b.is_ascii_digit()).fold(0u64, |q, &b| q * 10 + u64::from(b - b'0'));
    let exp = std::str::from_utf8(&s[(e + 1).min(len)..]).ok().and_then(|x| x.parse().ok()).unwrap_or(0);
    (q, exp)
}

#[cfg(test)]
mod tests {
    use super::{digits17_exact, digits17_fmt, format_g17};

    fn libc_g17(d: f64) -> String {
        let mut buf = [0u8; 64];
        // SAFETY: the buffer is 64 bytes and snprintf writes at most that many, NUL included; the format takes
        // one double.
        let n = unsafe { libc::snprintf(buf.as_mut_ptr().cast(), buf.len(), c"%.17g".as_ptr(), d) };
        String::from_utf8_lossy(&buf[..n as usize]).into_owned()
    }

    fn ours(d: f64) -> String {
        let mut out = [0u8; 32];
        let n = format_g17(d, &mut out);
        String::from_utf8_lossy(&out[..n]).into_owned()
    }

    #[test]
    fn matches_printf_on_chosen_values() {
        let values = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.1,
            0.5,
            2.5,
            1e20,
            1e16,
            1e17,
            9.999999999999999e16,
            1.5e-7,
            1e-4,
            9.99e-5,
            1e-5,
            123456789.125,
            1234567890123456.0 + 0.25,
            1234567890123456.0 + 0.75,
            5e-324,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            0.1f32 as f64,
            3.4028235e38f32 as f64,
            f32::MIN_POSITIVE as f64,
        ];
        for d in values {
            assert_eq!(ours(d), libc_g17(d), "{d:e}");
        }
    }

    #[test]
    fn integer_path_agrees_with_formatting_and_covers_f32_values() {
        let mut x: u64 = 0x9E3779B97F4A7C15;
        let mut covered = 0;
        for i in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = if i % 2 == 0 { f64::from_bits(x >> 1) } else { f32::from_bits((x as u32) >> 1) as f64 };
            if let (true, Some(fast)) = (d.is_finite(), digits17_exact(d)) {
                assert_eq!(fast, digits17_fmt(d), "{d:e}");
                covered += 1;
            }
        }
        assert!(covered > 50_000, "{covered}");
        for d in [0.1f32 as f64, 0.001f32 as f64, 123.456f32 as f64, 5.0, 1e20, 2f64.powi(73)] {
            assert!(digits17_exact(d).is_some(), "{d}");
        }
    }

    #[test]
    fn matches_printf_on_random_doubles_and_floats() {
        let mut x: u64 = 0x2545F4914F6CDD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..300_000 {
            let bits = next();
            let d = match i % 4 {
                0 => f64::from_bits(bits),
                1 => f32::from_bits(bits as u32) as f64,
                // Ties at the 18th digit: 16-digit integers plus a quarter or three.
                2 => (1e15 + (bits % 9_000_000_000_000_000) as f64 / 1000.0).floor() + [0.25, 0.75, 0.5][i % 3],
                _ => (bits % 100_000) as f64 / [1.0, 8.0, 1024.0, 1e4][(i / 4) % 4],
            };
            if d.is_finite() {
                assert_eq!(ours(d), libc_g17(d), "{d:e} ({:#x})", d.to_bits());
            }
        }
    }
}
