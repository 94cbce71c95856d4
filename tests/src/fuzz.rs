//! A small mutation fuzzer for stable Rust, so CI runs the cargo-fuzz targets (`fuzz/targets/`)
//! for a bounded time without nightly or libFuzzer.
//!
//! It is not coverage guided. It starts from the target's seed corpus and dictionary (the same
//! files `cargo fuzz` uses), then applies libFuzzer's classic mutations (byte flips, insertions
//! of dictionary tokens and random bytes, deletions, duplicated chunks, splices of two corpus
//! entries) to corpus entries chosen at random. An input that makes the target parse further
//! than the input it came from is not known here; instead inputs that the target accepted
//! without a panic are kept in a bounded corpus with a small probability, so mutations compound.
//!
//! Runs are reproducible: the RNG seed is printed and can be given back with
//! `FELIXRS_FUZZ_SEED`. A panic stops the run and returns the input (also written to
//! `target/fuzz-stable/crash-<target>-<seed>`), so the test fails naming the target, seed and input.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One fuzz target: its name (as in `fuzz/Cargo.toml`), the property check, its seed directory
/// and dictionary.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    pub seeds: Vec<Vec<u8>>,
    pub dict: Vec<Vec<u8>>,
}

/// What a run did.
#[derive(Debug)]
pub struct Outcome {
    pub name: &'static str,
    pub seed: u64,
    pub executions: u64,
    pub corpus: usize,
    /// The input that panicked, with the panic message.
    pub crash: Option<(Vec<u8>, String)>,
}

/// xorshift64*: enough randomness for mutations, reproducible from one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// The repository's `fuzz/` directory.
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Every file in `fuzz/seeds/<name>/` (none is fine: the dictionary and empty input remain).
pub fn load_seeds(name: &str) -> Vec<Vec<u8>> {
    let dir = fuzz_dir().join("seeds").join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("seed {}: {e}", p.display())))
        .collect()
}

/// The tokens of a libFuzzer dictionary (`"..."` lines, `\\`, `\"` and `\xNN` escapes).
pub fn load_dict(file: &str) -> Vec<Vec<u8>> {
    let path = fuzz_dir().join(file);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let start = l.find('"')?;
            let end = l.rfind('"')?;
            (end > start).then(|| unescape(&l[start + 1..end]))
        })
        .collect()
}

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            if b[i + 1] == b'x'
                && i + 3 < b.len()
                && let Ok(v) = u8::from_str_radix(&s[i + 2..i + 4], 16)
            {
                out.push(v);
                i += 4;
                continue;
            }
            out.push(b[i + 1]);
            i += 2;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

const MAX_LEN: usize = 8 * 1024;
const MAX_CORPUS: usize = 512;

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>], dict: &[Vec<u8>]) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        match rng.below(8) {
            0 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] ^= 1 << rng.below(8);
            }
            1 if !dict.is_empty() => {
                let tok = &dict[rng.below(dict.len())];
                let at = rng.below(input.len() + 1);
                input.splice(at..at, tok.iter().copied());
            }
            2 if !input.is_empty() => {
                let at = rng.below(input.len());
                let len = 1 + rng.below((input.len() - at).min(16));
                input.drain(at..at + len);
            }
            3 => {
                // Interesting bytes: separators, quotes, escapes, high and invalid UTF-8.
                const BYTES: &[u8] = b"\n\r\t \"'\\-!#:,/()[]{}=\x00\x7f\xc3\xff";
                let at = rng.below(input.len() + 1);
                let b = if rng.below(2) == 0 {
                    BYTES[rng.below(BYTES.len())]
                } else {
                    rng.next() as u8
                };
                input.insert(at, b);
            }
            4 if !input.is_empty() => {
                let from = rng.below(input.len());
                let len = 1 + rng.below((input.len() - from).min(64));
                let chunk: Vec<u8> = input[from..from + len].to_vec();
                let at = rng.below(input.len() + 1);
                input.splice(at..at, chunk);
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(input.len() + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            6 if !dict.is_empty() && !input.is_empty() => {
                // Overwrite in place with a token (keeps the length roughly).
                let tok = &dict[rng.below(dict.len())];
                let at = rng.below(input.len());
                let end = (at + tok.len()).min(input.len());
                input.splice(at..end, tok.iter().copied());
            }
            _ => {
                let at = rng.below(input.len() + 1);
                let n = rng.below(4);
                for _ in 0..n {
                    input.insert(at, rng.next() as u8);
                }
            }
        }
    }
    input.truncate(MAX_LEN);
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_string()
    }
}

/// Runs `target` for `budget` (every seed and dictionary token first, then mutations) from
/// RNG `seed`; stops at the first panic.
pub fn run(target: &Target, budget: Duration, seed: u64) -> Outcome {
    let mut rng = Rng(seed | 1);
    let mut corpus: Vec<Vec<u8>> = target.seeds.clone();
    corpus.push(Vec::new());
    corpus.extend(target.dict.iter().cloned());
    let mut out = Outcome {
        name: target.name,
        seed,
        executions: 0,
        corpus: 0,
        crash: None,
    };
    let exec = |input: &[u8]| catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
    // The seeds first: a crash there is a regression, not luck.
    for input in corpus.clone() {
        out.executions += 1;
        if let Err(p) = exec(&input) {
            out.crash = Some((input, panic_message(p)));
            return out;
        }
    }
    let start = Instant::now();
    while start.elapsed() < budget {
        for _ in 0..64 {
            let mut input = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, &mut input, &corpus, &target.dict);
            out.executions += 1;
            if let Err(p) = exec(&input) {
                out.crash = Some((input, panic_message(p)));
                return out;
            }
            if rng.below(64) == 0 {
                if corpus.len() >= MAX_CORPUS {
                    let victim =
                        target.seeds.len() + 1 + rng.below(corpus.len() - target.seeds.len() - 1);
                    corpus[victim] = input;
                } else {
                    corpus.push(input);
                }
            }
        }
    }
    out.corpus = corpus.len();
    out
}

/// Writes a crashing input under `target/fuzz-stable/` and returns the path.
pub fn save_crash(name: &str, seed: u64, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-stable");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("crash-{name}-{seed:016x}"));
    let _ = std::fs::write(&path, input);
    path
}
