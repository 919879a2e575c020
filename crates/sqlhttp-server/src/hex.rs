//! Lowercase hexadecimal digits written without the formatting machinery, for the names and ids
//! made on every request (a request's id, a guard savepoint's name). Knows digits only.

/// The low `N` nibbles of `bits` as lowercase hexadecimal digits, the most significant first
/// (`N` at most 32, a `u128`'s).
pub(crate) fn digits<const N: usize>(bits: u128) -> [u8; N] {
    const { assert!(N <= 32, "a u128 has 32 nibbles") };
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; N];
    for (index, digit) in hex.iter_mut().enumerate() {
        let nibble = (bits >> (4 * (N - 1 - index))) & 0xf;
        *digit = DIGITS[usize::from(u8::try_from(nibble).unwrap_or(0))];
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_formatting_s_own() {
        for bits in [
            0,
            1,
            0xabc,
            u128::from(u64::MAX),
            u128::MAX,
            0x0123_4567_89ab_cdef,
        ] {
            assert_eq!(digits::<32>(bits), *format!("{bits:032x}").as_bytes());
            let low = bits & u128::from(u64::MAX);
            assert_eq!(digits::<16>(bits), *format!("{low:016x}").as_bytes());
        }
    }
}
