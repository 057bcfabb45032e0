//! A jsonb value's text, byte for byte what `jsonb_out` (`jsonb::text`)
//! writes, read straight from jsonb's binary container.
//!
//! Event tables keep PgQ's text `ev_data`, so every jsonb payload sent is
//! turned into text once. PostgreSQL's jsonb_out walks the value with
//! JsonbIterator (a palloc'd iterator per container, each value copied into
//! a JsonbValue), copies each string before escaping it a byte at a time,
//! and formats each number with numeric_out; for a ~200-byte payload that
//! was a third of send_batch's backend CPU (benches/results/events.md).
//! This walks the containers in place, escapes runs of plain bytes at once,
//! and formats numbers from their base-10000 digits as numeric_out does;
//! anything it does not read as described here (a numeric that is not a
//! plain 4-byte-header value, an entry type it does not know) falls back to
//! PostgreSQL's own functions for that value, so the output is always
//! jsonb_out's. pg_test/tests/events_send_direct.rs compares the two over
//! thousands of generated values.
use pgrx::pg_sys;

const JB_CMASK: u32 = 0x0FFF_FFFF;
const JB_FSCALAR: u32 = 0x1000_0000;
const JB_FOBJECT: u32 = 0x2000_0000;
const JB_FARRAY: u32 = 0x4000_0000;
const JENTRY_OFFLENMASK: u32 = 0x0FFF_FFFF;
const JENTRY_TYPEMASK: u32 = 0x7000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;
const JENTRY_ISSTRING: u32 = 0x0000_0000;
const JENTRY_ISNUMERIC: u32 = 0x1000_0000;
const JENTRY_ISBOOL_FALSE: u32 = 0x2000_0000;
const JENTRY_ISBOOL_TRUE: u32 = 0x3000_0000;
const JENTRY_ISNULL: u32 = 0x4000_0000;
const JENTRY_ISCONTAINER: u32 = 0x5000_0000;

/// Containers nested deeper than this are written by PostgreSQL's jsonb_out
/// instead: it walks the value with an iterator, without recursion, while
/// this walk recurses once per level. Payloads nest a few levels; a value
/// nested deeper costs one more pass, never a stack that grows with what
/// the producer sent (max_stack_depth can be raised past what a recursion
/// per level of a big value would need).
const MAX_DEPTH: u32 = 128;

/// A container nested deeper than [`MAX_DEPTH`] was met.
struct TooDeep;

/// Appends the text of the jsonb value at `jb` (a detoasted jsonb datum
/// with a 4-byte header) to `out`.
///
/// # Safety
/// `jb` must point at a valid, detoasted jsonb varlena.
pub unsafe fn append_jsonb_text(out: &mut Vec<u8>, jb: *const u8) {
    unsafe {
        let root = jb.add(4);
        let header = read_u32(root);
        let from = out.len();
        let walked = if header & JB_FSCALAR != 0 {
            // a raw scalar: an array of one element, written without brackets
            let (entry, start, end, base) = child(root, 1, 0, 0);
            put_value(out, entry, base, start, end, 0)
        } else {
            put_container(out, root, 0)
        };
        if walked.is_err() {
            out.truncate(from);
            jsonb_out(out, jb);
        }
    }
}

/// PostgreSQL's own text of the jsonb datum at `jb`.
unsafe fn jsonb_out(out: &mut Vec<u8>, jb: *const u8) {
    unsafe {
        let s = pgrx::direct_function_call::<&core::ffi::CStr>(
            pg_sys::jsonb_out,
            &[Some(pg_sys::Datum::from(jb))],
        )
        .expect("jsonb_out returned NULL");
        out.extend_from_slice(s.to_bytes());
    }
}

#[inline]
unsafe fn read_u32(p: *const u8) -> u32 {
    unsafe { (p as *const u32).read_unaligned() }
}

/// Entry `i` of a container of `n` entries whose data area starts at
/// `base`: (JEntry, start offset, end offset, base), where `start` is the
/// end of entry i-1 (the caller passes it along, walking in order).
#[inline]
unsafe fn child(
    container: *const u8,
    n: usize,
    i: usize,
    start: usize,
) -> (u32, usize, usize, *const u8) {
    unsafe {
        let children = container.add(4);
        let base = children.add(4 * n);
        let e = read_u32(children.add(4 * i));
        let end = if e & JENTRY_HAS_OFF != 0 {
            (e & JENTRY_OFFLENMASK) as usize
        } else {
            start + (e & JENTRY_OFFLENMASK) as usize
        };
        (e, start, end, base)
    }
}

unsafe fn put_container(out: &mut Vec<u8>, c: *const u8, depth: u32) -> Result<(), TooDeep> {
    if depth >= MAX_DEPTH {
        return Err(TooDeep);
    }
    unsafe {
        let header = read_u32(c);
        let count = (header & JB_CMASK) as usize;
        if header & JB_FOBJECT != 0 {
            out.push(b'{');
            let n = 2 * count;
            // keys are entries 0..count, their values count..2*count; the
            // values' data follows all the keys' data
            let mut kstart = 0;
            let mut vstart = {
                let mut s = 0;
                for i in 0..count {
                    s = child(c, n, i, s).2;
                }
                s
            };
            for i in 0..count {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                let (_, ks, ke, base) = child(c, n, i, kstart);
                kstart = ke;
                put_string(out, std::slice::from_raw_parts(base.add(ks), ke - ks));
                out.extend_from_slice(b": ");
                let (ve, vs, vend, base) = child(c, n, count + i, vstart);
                vstart = vend;
                put_value(out, ve, base, vs, vend, depth)?;
            }
            out.push(b'}');
        } else {
            debug_assert!(header & JB_FARRAY != 0);
            out.push(b'[');
            let mut start = 0;
            for i in 0..count {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                let (e, s, end, base) = child(c, count, i, start);
                start = end;
                put_value(out, e, base, s, end, depth)?;
            }
            out.push(b']');
        }
    }
    Ok(())
}

/// A container's child values are int-aligned within the data area.
#[inline]
fn intalign(x: usize) -> usize {
    (x + 3) & !3
}

/// Writes one entry of a container at `depth` (a nested container is at
/// depth + 1).
unsafe fn put_value(
    out: &mut Vec<u8>,
    e: u32,
    base: *const u8,
    start: usize,
    end: usize,
    depth: u32,
) -> Result<(), TooDeep> {
    unsafe {
        match e & JENTRY_TYPEMASK {
            JENTRY_ISSTRING => put_string(
                out,
                std::slice::from_raw_parts(base.add(start), end - start),
            ),
            JENTRY_ISNUMERIC => put_numeric(out, base.add(intalign(start))),
            JENTRY_ISBOOL_FALSE => out.extend_from_slice(b"false"),
            JENTRY_ISBOOL_TRUE => out.extend_from_slice(b"true"),
            JENTRY_ISNULL => out.extend_from_slice(b"null"),
            JENTRY_ISCONTAINER => return put_container(out, base.add(intalign(start)), depth + 1),
            other => pgrx::error!("pgque: unknown jsonb entry type {other:#x}"),
        }
    }
    Ok(())
}

/// escape_json: `"`, `\` and the control characters escaped, the rest as it is.
///
/// Payload strings are mostly plain bytes: they are scanned 8 at a time
/// ([`plain8`]) and copied in runs; only a group of 8 holding a byte to
/// escape is looked at byte by byte.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let mut run = 0;
    let mut i = 0;
    while i < s.len() {
        if i + 8 <= s.len() && plain8(u64::from_le_bytes(s[i..i + 8].try_into().unwrap())) {
            i += 8;
            continue;
        }
        let end = (i + 8).min(s.len());
        while i < end {
            let b = s[i];
            let esc: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                0x08 => b"\\b",
                0x0c => b"\\f",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                0..=0x1f => b"",
                _ => {
                    i += 1;
                    continue;
                }
            };
            out.extend_from_slice(&s[run..i]);
            run = i + 1;
            if esc.is_empty() {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 15) as usize]);
            } else {
                out.extend_from_slice(esc);
            }
            i += 1;
        }
    }
    out.extend_from_slice(&s[run..]);
    out.push(b'"');
}

/// True when none of the 8 bytes of `x` is `"`, `\` or below 0x20 (the
/// bytes escape_json changes). The zero-byte tests are exact as a yes/no
/// answer; bytes of 0x80 and above never match.
#[inline]
fn plain8(x: u64) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(LO) & !v & HI;
    let quote = has_zero(x ^ (LO * b'"' as u64));
    let backslash = has_zero(x ^ (LO * b'\\' as u64));
    let control = x.wrapping_sub(LO * 0x20) & !x & HI;
    (quote | backslash | control) == 0
}

/// numeric_out of the numeric at `n`: its base-10000 digits written as
/// get_str_from_var does; numeric_out itself for anything but a finite
/// value with a 4-byte header.
unsafe fn put_numeric(out: &mut Vec<u8>, n: *const u8) {
    unsafe {
        let word = read_u32(n);
        // 4-byte uncompressed varlena header (little-endian: low two bits 00)
        let plain4b = cfg!(target_endian = "little") && word & 3 == 0;
        let h = (n.add(4) as *const u16).read_unaligned();
        if !plain4b || h & 0xC000 == 0xC000 {
            return numeric_out(out, n);
        }
        let size = (word >> 2) as usize;
        let (neg, dscale, weight, hdr) = if h & 0x8000 != 0 {
            // short format
            let neg = h & 0x2000 != 0;
            let dscale = ((h & 0x1F80) >> 7) as i32;
            let w = if h & 0x0040 != 0 {
                !0x003Fi32 | (h & 0x003F) as i32
            } else {
                (h & 0x003F) as i32
            };
            (neg, dscale, w, 6usize)
        } else {
            let neg = h & 0x4000 != 0;
            let dscale = (h & 0x3FFF) as i32;
            let w = (n.add(6) as *const i16).read_unaligned() as i32;
            (neg, dscale, w, 8usize)
        };
        let ndigits = (size.saturating_sub(hdr) / 2) as i32;
        let digit = |d: i32| -> u16 {
            if d >= 0 && d < ndigits {
                (n.add(hdr + 2 * d as usize) as *const u16).read_unaligned()
            } else {
                0
            }
        };
        if ndigits == 0 {
            // zero: numeric_out writes "0" and the scale's zeroes, no sign
            out.push(b'0');
            if dscale > 0 {
                out.push(b'.');
                out.extend(std::iter::repeat_n(b'0', dscale as usize));
            }
            return;
        }
        if neg {
            out.push(b'-');
        }
        let mut d: i32;
        if weight < 0 {
            d = weight + 1;
            out.push(b'0');
        } else {
            d = 0;
            while d <= weight {
                let mut dig = digit(d);
                let mut putit = d > 0;
                for div in [1000u16, 100, 10] {
                    let d1 = dig / div;
                    dig -= d1 * div;
                    putit |= d1 > 0;
                    if putit {
                        out.push(b'0' + d1 as u8);
                    }
                }
                out.push(b'0' + dig as u8);
                d += 1;
            }
        }
        if dscale > 0 {
            out.push(b'.');
            let end = out.len() + dscale as usize;
            let mut i = 0;
            while i < dscale {
                let mut dig = digit(d);
                for div in [1000u16, 100, 10] {
                    let d1 = dig / div;
                    dig -= d1 * div;
                    out.push(b'0' + d1 as u8);
                }
                out.push(b'0' + dig as u8);
                d += 1;
                i += 4;
            }
            out.truncate(end);
        }
    }
}

unsafe fn numeric_out(out: &mut Vec<u8>, n: *const u8) {
    unsafe {
        let s = pgrx::direct_function_call::<&core::ffi::CStr>(
            pg_sys::numeric_out,
            &[Some(pg_sys::Datum::from(n))],
        )
        .expect("numeric_out returned NULL");
        out.extend_from_slice(s.to_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::{plain8, put_string};

    /// escape_json byte by byte, the reference for put_string's fast scan.
    fn escape_slow(s: &[u8]) -> Vec<u8> {
        let mut out = vec![b'"'];
        for &b in s {
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0..=0x1f => out.extend_from_slice(format!("\\u{:04x}", b).as_bytes()),
                _ => out.push(b),
            }
        }
        out.push(b'"');
        out
    }

    #[test]
    fn plain8_finds_every_byte_to_escape_at_every_position() {
        for pos in 0..8 {
            for b in 0..=255u8 {
                for fill in [b'a', 0x7f, 0x80, 0xff, 0x21, 0x5d] {
                    let mut bytes = [fill; 8];
                    bytes[pos] = b;
                    let needs = bytes.iter().any(|&c| c < 0x20 || c == b'"' || c == b'\\');
                    assert_eq!(plain8(u64::from_le_bytes(bytes)), !needs, "{bytes:?}");
                }
            }
        }
    }

    #[test]
    fn fast_scan_matches_bytewise_escaping() {
        // a fixed-seed generator: strings of every length up to 40 mixing
        // plain ASCII, UTF-8 bytes and bytes to escape, at every offset
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet: &[u8] = b"abcxyz \"\\\n\t\x01\x1f\x7f\xc3\xa9{}:,0123456789";
        for len in 0..40 {
            for _ in 0..200 {
                let s: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // mostly plain bytes, as payloads are
                        if x.is_multiple_of(4) {
                            alphabet[(x >> 8) as usize % alphabet.len()]
                        } else {
                            b'a' + (x >> 16) as u8 % 26
                        }
                    })
                    .collect();
                let mut out = Vec::new();
                put_string(&mut out, &s);
                assert_eq!(out, escape_slow(&s), "{s:?}");
            }
        }
    }

    #[test]
    fn escapes_as_escape_json() {
        let mut out = Vec::new();
        put_string(&mut out, b"a\"b\\c\x08\x0c\n\r\t\x01\x1f\x7f \xc3\xa9");
        assert_eq!(
            out,
            b"\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0001\\u001f\x7f \xc3\xa9\"".to_vec()
        );
    }
}
