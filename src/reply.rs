//! A reply as plain data, built by pure code and written to the client by `redis::reply`.

use std::borrow::Cow;

use crate::error::Error;

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
/// Redis 7.0 formats them with `snprintf`, which takes ~0.1 µs per value. Rust's exact formatting rounds the
/// binary value half to even, as glibc does, so the digits are the same; only the layout is `%g`'s.
pub fn format_g17(d: f64, out: &mut [u8; 32]) -> usize {
    use std::io::Write;
    let mut exp_form = [0u8; 40];
    let len = {
        let mut w = &mut exp_form[..];
        // "[-]d.dddddddddddddddde[-]x": 17 significant digits, correctly rounded.
        let _ = write!(w, "{d:.16e}");
        40 - w.len()
    };
    let s = &exp_form[..len];
    let (negative, s) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    let e = s.iter().position(|&b| b == b'e').unwrap_or(s.len());
    let mut digits = [b'0'; 17];
    digits[0] = s.first().copied().unwrap_or(b'0');
    let fraction = s.get(2..e).unwrap_or(&[]);
    digits[1..1 + fraction.len().min(16)].copy_from_slice(&fraction[..fraction.len().min(16)]);
    let exp_digits = s.get(e + 1..).unwrap_or(&[]);
    let (exp_negative, exp_digits) = match exp_digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, exp_digits),
    };
    let magnitude = exp_digits.iter().fold(0i32, |x, &b| x * 10 + i32::from(b - b'0'));
    let exp = if exp_negative { -magnitude } else { magnitude };
    let trim = |d: &[u8]| d.len() - d.iter().rev().take_while(|&&b| b == b'0').count();

    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        out[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    if negative {
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
        let mut e_buf = [0u8; 4];
        let e_len = {
            let mut w = &mut e_buf[..];
            let _ = write!(w, "{:02}", exp.unsigned_abs());
            4 - w.len()
        };
        put(&e_buf[..e_len]);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::format_g17;

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
