//! Deterministic generators of the inputs the differential tests feed both
//! a path below SQL and the SQL it stands for: JSON texts and queue names.
#![allow(dead_code)]

/// A small deterministic generator of JSON texts: every kind of value,
/// numbers in many forms and scales, strings that need escaping, wide
/// containers (more than 32 children: entries that carry offsets) and deep ones.
pub struct Gen(pub u64);

impl Gen {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    pub fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() as usize) % xs.len()]
    }
    pub fn number(&mut self) -> String {
        match self.next() % 8 {
            0 => self
                .pick(&[
                    "0",
                    "-0",
                    "0.0",
                    "0.000",
                    "1",
                    "-1",
                    "10000",
                    "9999",
                    "100000000",
                ])
                .to_string(),
            1 => format!("{}", self.next() as i64 - (1 << 30)),
            2 => format!(
                "{}.{:0width$}",
                self.next() % 100000,
                self.next() % 1000,
                width = (self.next() % 6) as usize
            ),
            3 => format!(
                "-0.{:0width$}{}",
                0,
                self.next() % 997,
                width = (self.next() % 12) as usize
            ),
            4 => format!("{}e{}", self.next() % 1000, (self.next() % 60) as i64 - 30),
            5 => format!(
                "-{}.{}E+{}",
                self.next() % 10,
                self.next() % 100,
                self.next() % 25
            ),
            6 => "123456789012345678901234567890.123456789012345678900".to_string(),
            _ => format!(
                "{}.{}",
                self.next() % 10,
                "0".repeat(1 + (self.next() % 40) as usize)
            ),
        }
    }
    pub fn string(&mut self) -> String {
        let mut s = String::from("\"");
        for _ in 0..self.next() % 12 {
            s.push_str(self.pick(&[
                "a",
                "Z",
                " ",
                "\\\"",
                "\\\\",
                "\\/",
                "\\b",
                "\\f",
                "\\n",
                "\\r",
                "\\t",
                "\\u0001",
                "\\u001f",
                "\\u007f",
                "\\u00e9",
                "é",
                "✓",
                "😀",
                "\\ud83d\\ude00",
                // every plane: the BMP's letters that fold or sort apart from
                // their bytes, and one code point of each supplementary plane
                // (SMP, SIP, TIP, SSP, the private-use planes), raw and escaped
                "ß",
                "ǅ",
                "İı",
                "e\u{0301}",
                "\u{feff}",
                "\u{2028}",
                "𐀀",
                "\\ud800\\udc00",
                "𠀀",
                "\u{30000}",
                "\u{e0041}",
                "\u{f0000}",
                "\u{10fffd}",
                "\\udbff\\udffd",
                "key",
                "0123456789abcdefghij",
            ]));
        }
        s.push('"');
        s
    }
    pub fn value(&mut self, depth: u32) -> String {
        let k = self.next() % if depth > 4 { 5 } else { 8 };
        match k {
            0 => self.number(),
            1 => self.string(),
            2 => self.pick(&["true", "false", "null"]).to_string(),
            3 | 4 => self.number(),
            5 => {
                let n = if self.next().is_multiple_of(5) {
                    40 + self.next() % 40
                } else {
                    self.next() % 5
                };
                let items: Vec<String> = (0..n).map(|_| self.value(depth + 1)).collect();
                format!("[{}]", items.join(","))
            }
            _ => {
                let n = if self.next().is_multiple_of(5) {
                    35 + self.next() % 40
                } else {
                    self.next() % 6
                };
                let items: Vec<String> = (0..n)
                    .map(|_| format!("{}: {}", self.string(), self.value(depth + 1)))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
        }
    }
}

/// Pieces of queue names: ASCII of both cases, digits and punctuation, and
/// letters whose order differs between C, libc en_US, ICU and the builtin
/// provider (case, accents, ligatures, scripts, a supplementary-plane one).
const NAME_PIECES: [&str; 40] = [
    "a",
    "b",
    "z",
    "A",
    "B",
    "Z",
    "orders",
    "Orders",
    "ORDERS",
    "billing",
    "-",
    "_",
    ".",
    " ",
    "0",
    "1",
    "9",
    "eu",
    "EU",
    "é",
    "É",
    "e\u{0301}",
    "ß",
    "ss",
    "ǅ",
    "İ",
    "ı",
    "ö",
    "Ö",
    "ø",
    "Ω",
    "ω",
    "日本",
    "한",
    "א",
    "ـ",
    "😀",
    "𠀀",
    "#x",
    "/",
];

impl Gen {
    /// A queue name of 1 to 57 bytes built from [`NAME_PIECES`].
    pub fn name(&mut self) -> String {
        let mut s = String::new();
        for _ in 0..1 + self.next() % 5 {
            let p = NAME_PIECES[(self.next() as usize) % NAME_PIECES.len()];
            if s.len() + p.len() > 57 {
                break;
            }
            s.push_str(p);
        }
        if s.is_empty() {
            s.push('q');
        }
        s
    }
}
