//! Small helpers: a seeded random number generator and the path patterns of
//! `fail-fsync`.

/// SplitMix64: a seeded generator, so a `cut --reorder SEED` is reproducible.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform number in `0..=n`.
    pub(crate) fn up_to(&mut self, n: usize) -> usize {
        // The modulo bias is irrelevant at these sizes.
        (self.next_u64() % (n as u64 + 1)) as usize
    }

    /// True with probability 1/2.
    pub(crate) fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }
}

/// Whether `path` (relative to the mount root, no leading `/`) matches `pattern`: a glob
/// when the pattern has `*` or `?` (`*` any run of characters, `/` included; `?` one
/// character; the whole path must match), else a substring of the path.
pub(crate) fn matches(pattern: &str, path: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return path.contains(pattern);
    }
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = path.chars().collect();
    // Iterative glob with backtracking to the last star.
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(42);
        let b: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(43).next_u64(), a[0]);
        let mut r = Rng::new(7);
        let heads = (0..1000).filter(|_| r.coin()).count();
        assert!((400..600).contains(&heads), "{heads}");
    }

    #[test]
    fn patterns() {
        assert!(matches("wal", "db/x.sqlite-wal"));
        assert!(!matches("shm", "db/x.sqlite-wal"));
        assert!(matches("*-wal", "db/x.sqlite-wal"));
        assert!(matches("db/*.sqlite", "db/a/b.sqlite"));
        assert!(!matches("db/*.sqlite", "db/a/b.sqlite-wal"));
        assert!(matches("?b", "ab"));
        assert!(matches("*", ""));
        assert!(!matches("a*b*c", "acb"));
    }
}
