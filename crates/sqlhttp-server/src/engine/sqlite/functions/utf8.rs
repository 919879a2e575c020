//! The UTF-8 reading of SQLite's C string code, shared by the replacements: where a
//! NUL-terminated string ends ([`up_to_nul`]), `sqlite3Utf8Read` ([`utf8_read`]),
//! `sqlite3Utf8ReadLimited` ([`utf8_read_limited`]) and `SQLITE_SKIP_UTF8` ([`skip_utf8`]).
//!
//! Byte-level helpers only; nothing here knows a function, a connection or the job's clock.

/// The part of `bytes` that SQLite's NUL-terminated string code sees.
pub(super) fn up_to_nul(bytes: &[u8]) -> &[u8] {
    match memchr::memchr(0, bytes) {
        Some(end) => &bytes[..end],
        None => bytes,
    }
}

pub(super) fn is_continuation(byte: u8) -> bool {
    byte & 0xc0 == 0x80
}

/// The byte at `at`, or the terminating NUL past the end.
#[inline]
pub(super) fn byte_at(bytes: &[u8], at: usize) -> u8 {
    bytes.get(at).copied().unwrap_or(0)
}

/// `sqlite3Utf8Trans1`: the payload bits of a lead byte 0xc0..=0xff.
const UTF8_TRANS1: [u8; 64] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x00, 0x01, 0x02, 0x03, 0x00, 0x01, 0x00, 0x00,
];

/// `sqlite3Utf8Read` over a NUL-terminated string: the character at `*at` (a lead byte takes
/// every continuation byte after it; overlong forms and surrogates read as U+FFFD; a stray
/// continuation byte is a character of its own), moving `*at` past it. At the end it reads the
/// terminating 0 and moves one past it, as SQLite's pointer does.
#[inline]
pub(super) fn utf8_read(bytes: &[u8], at: &mut usize) -> u32 {
    let mut c = u32::from(byte_at(bytes, *at));
    *at += 1;
    if c >= 0xc0 {
        c = utf8_rest(bytes, at, c);
    }
    c
}

/// [`utf8_read`] past a lead byte `c` (0xc0 and above).
pub(super) fn utf8_rest(bytes: &[u8], at: &mut usize, lead: u32) -> u32 {
    let mut c = u32::from(UTF8_TRANS1[(lead - 0xc0) as usize]);
    while is_continuation(byte_at(bytes, *at)) {
        c = (c << 6) + u32::from(byte_at(bytes, *at) & 0x3f);
        *at += 1;
    }
    if c < 0x80 || (c & 0xffff_f800) == 0xd800 {
        c = 0xfffd;
    }
    c
}

/// `sqlite3Utf8ReadLimited` at a lead byte (0xc0 and above) at `*at`: the lead byte and at most
/// three continuation bytes before the end of `bytes`, with no replacement of overlong forms or
/// surrogates, moving `*at` past them (as `jsonLabelCompareEscaped` reads a label).
pub(super) fn utf8_read_limited(bytes: &[u8], at: &mut usize) -> u32 {
    let lead = bytes[*at];
    let mut c = u32::from(UTF8_TRANS1[usize::from(lead - 0xc0)]);
    let mut n = 1;
    while n < 4 && bytes.get(*at + n).is_some_and(|&b| is_continuation(b)) {
        c = (c << 6) + u32::from(bytes[*at + n] & 0x3f);
        n += 1;
    }
    *at += n;
    c
}

/// `SQLITE_SKIP_UTF8`: moves `*at` past one character without decoding it.
pub(super) fn skip_utf8(bytes: &[u8], at: &mut usize) {
    let lead = byte_at(bytes, *at);
    *at += 1;
    if lead >= 0xc0 {
        while is_continuation(byte_at(bytes, *at)) {
            *at += 1;
        }
    }
}
