//! A partition slot and the key hash that picks it: pure arithmetic, no SQL,
//! so clients' slot maths can be checked without a server.

/// Most slots a partitioned consumer may have.
pub const MAX_SLOTS: i32 = 256;

/// Slot `k` of a consumer with `n` slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub n: i32,
    pub k: i32,
}

/// slot(K) = (h % N + N) % N for h = hashtextextended(K, 0): PostgreSQL's `%`
/// keeps the dividend's sign, so this is the non-negative remainder.
pub fn slot_of_hash(h: i64, n: i32) -> i32 {
    let n = n as i64;
    ((h % n + n) % n) as i32
}

/// PostgreSQL's hashtextextended(key, 0) for a deterministic collation (the
/// default): hash_bytes_extended (Bob Jenkins' lookup3, src/common/hashfn.c)
/// over the key's bytes. Pure Rust, so clients' slot maths can be checked
/// without a server; a pg_test compares it with the server's function.
pub fn key_hash(key: &str) -> i64 {
    hash_bytes_extended(key.as_bytes(), 0) as i64
}

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn final_mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// PostgreSQL's hash_bytes_extended (little-endian byte order, which both
/// of its code paths read on every platform PostgreSQL hashes identically).
pub fn hash_bytes_extended(k: &[u8], seed: u64) -> u64 {
    let init = 0x9e37_79b9u32
        .wrapping_add(k.len() as u32)
        .wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (init, init, init);
    if seed != 0 {
        a = a.wrapping_add((seed >> 32) as u32);
        b = b.wrapping_add(seed as u32);
        mix(&mut a, &mut b, &mut c);
    }
    let word = |w: &[u8]| -> u32 {
        w.iter()
            .enumerate()
            .fold(0u32, |acc, (i, &x)| acc.wrapping_add((x as u32) << (8 * i)))
    };
    let mut rest = k;
    while rest.len() >= 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        mix(&mut a, &mut b, &mut c);
        rest = &rest[12..];
    }
    // The last 0..11 bytes: a takes bytes 0-3, b 4-7, c 8-10 shifted up one
    // byte (its lowest byte is left for the length, as in lookup3).
    let n = rest.len();
    a = a.wrapping_add(word(&rest[..n.min(4)]));
    if n > 4 {
        b = b.wrapping_add(word(&rest[4..n.min(8)]));
    }
    if n > 8 {
        c = c.wrapping_add(word(&rest[8..n]) << 8);
    }
    final_mix(&mut a, &mut b, &mut c);
    ((b as u64) << 32) | c as u64
}

/// The slot of a partition key (NULL key: slot 0).
pub fn slot_of(key: Option<&str>, n: i32) -> i32 {
    key.map_or(0, |k| slot_of_hash(key_hash(k), n))
}

/// The SQL expression of an event's slot for `n` slots: the key rides
/// ev_extra1, a NULL key is slot 0. Index and queries use this same text.
pub fn slot_expr(n: i32) -> String {
    format!("coalesce((hashtextextended(ev_extra1, 0) % {n} + {n}) % {n}, 0)")
}

/// The subscription name of slot `k` of consumer `c`.
pub fn slot_sub_name(consumer: &str, k: i32) -> String {
    format!("{consumer}#{k}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_is_the_non_negative_remainder() {
        assert_eq!(slot_of_hash(0, 16), 0);
        assert_eq!(slot_of_hash(17, 16), 1);
        assert_eq!(slot_of_hash(-1, 16), 15);
        assert_eq!(slot_of_hash(-17, 16), 15);
        assert_eq!(slot_of_hash(i64::MIN, 256), 0);
        assert_eq!(slot_of_hash(i64::MAX, 256), 255);
        assert_eq!(
            slot_of_hash(i64::MIN + 1, 3),
            (i64::MIN + 1).rem_euclid(3) as i32
        );
        for h in [-1_000_003i64, -7, 0, 5, 99_999_989] {
            for n in 1..=256 {
                let k = slot_of_hash(h, n);
                assert!((0..n).contains(&k));
                assert_eq!(k as i64, h.rem_euclid(n as i64));
            }
        }
    }

    #[test]
    fn slot_names_and_expression() {
        assert_eq!(slot_sub_name("orders", 7), "orders#7");
        assert_eq!(
            slot_expr(16),
            "coalesce((hashtextextended(ev_extra1, 0) % 16 + 16) % 16, 0)"
        );
    }
}
