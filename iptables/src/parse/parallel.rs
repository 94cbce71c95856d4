//! The streaming roundtrip on several threads: a large dump is cut at line boundaries into
//! chunks, each parsed and rendered by the one parser's per-line code ([`parse_lines`]) on a
//! scoped thread into its own buffer; the buffers, in order, are the rendering.
//!
//! What a line renders to, and whether it parses, depends on nothing before it but whether a
//! table is open (the rule state a thread keeps is a cache of names). So a chunk starts from a
//! guess of that one bit, read from the few lines before it ([`guess_open`]), and the guesses are
//! checked once every chunk is done: chunk `k` must end with a table open exactly when chunk
//! `k + 1` guessed one, and the last must end with none. Then each chunk saw what the sequential
//! parse sees and the output is its output. Anything else — a wrong guess, an error in any
//! chunk — and the whole text is parsed again on the calling thread, which gives the sequential
//! path's output and its first error (lowest line, with its table names and line numbers) by
//! construction; errors are rare, so they pay the double parse.

use super::{Open, ParseError, Renderer, parse, parse_lines};

/// Below this size the threads do not pay (their start and the buffers' extra page faults).
pub const PARALLEL_MIN_BYTES: usize = 4 << 20;

/// At most this many chunks, whatever the machine has.
pub const MAX_THREADS: usize = 8;

/// Lines [`guess_open`] looks back over before it guesses "open".
const GUESS_LINES: usize = 64;

/// The number of chunks [`super::roundtrip_save`] cuts a text of `len` bytes into: 1 below
/// [`PARALLEL_MIN_BYTES`], else the cores available (`std::thread::available_parallelism`),
/// at most [`MAX_THREADS`].
pub fn roundtrip_threads(len: usize) -> usize {
    if len < PARALLEL_MIN_BYTES {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS)
}

/// The rendering of `text` as [`super::roundtrip_save`] gives it, in pieces to be written in order
/// (no copy into one buffer), cut into `threads` chunks (1: the sequential path).
pub fn roundtrip_save_parts(text: &str, threads: usize) -> Result<Vec<String>, ParseError> {
    let mut first = String::with_capacity(capacity(text.len() / threads.max(1)));
    let mut parts = roundtrip_into(text, threads, &mut first)?;
    parts.insert(0, first);
    Ok(parts)
}

/// Output capacity for `len` bytes of input: kernel output comes back as long as it was.
fn capacity(len: usize) -> usize {
    len + len / 8 + 64
}

/// Renders `text` in `threads` chunks: the first appended to `first`, the others returned.
/// On an error `first` holds what the sequential path leaves (a prefix of the rendering).
pub(super) fn roundtrip_into(
    text: &str,
    threads: usize,
    first: &mut String,
) -> Result<Vec<String>, ParseError> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let chunks = split(body, threads);
    if chunks.len() < 2 {
        sequential(text, first)?;
        return Ok(Vec::new());
    }
    let start = first.len();
    let mut guesses: Vec<Open> = vec![Open::No];
    guesses.extend(chunks[1..].iter().map(|c| guess_open(&body[..c.start])));
    let run = |chunk: &str, guess: Open| -> Result<(Open, String), ParseError> {
        let mut out = String::with_capacity(capacity(chunk.len()));
        let end = parse_lines(chunk, guess, None, &mut Renderer { out: &mut out })?;
        Ok((end, out))
    };
    let results: Vec<Result<(Open, String), ParseError>> = std::thread::scope(|s| {
        // A thread that cannot be started (a process or cgroup thread limit) leaves its chunk to
        // this thread: slower, never an error.
        let handles: Vec<_> = chunks[1..]
            .iter()
            .zip(&guesses[1..])
            .map(|(range, &guess)| {
                let chunk = &body[range.clone()];
                std::thread::Builder::new()
                    .name("roundtrip".into())
                    .spawn_scoped(s, move || run(chunk, guess))
                    .map_err(|_| (chunk, guess))
            })
            .collect();
        let head = &body[chunks[0].clone()];
        let mut results = vec![
            parse_lines(head, Open::No, None, &mut Renderer { out: first })
                .map(|end| (end, String::new())),
        ];
        results.extend(handles.into_iter().map(|h| match h {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err((chunk, guess)) => run(chunk, guess),
        }));
        results
    });
    let mut parts = Vec::with_capacity(results.len() - 1);
    let mut consistent = true;
    for (k, r) in results.into_iter().enumerate() {
        let Ok((end, out)) = r else {
            consistent = false;
            break;
        };
        let next_open = guesses.get(k + 1).is_some_and(|&g| g != Open::No);
        if (end != Open::No) != next_open {
            consistent = false;
            break;
        }
        if k > 0 {
            parts.push(out);
        }
    }
    if !consistent {
        first.truncate(start);
        sequential(text, first)?;
        return Ok(Vec::new());
    }
    if !text.ends_with('\n') {
        let last = parts.last_mut().unwrap_or(first);
        if last.ends_with('\n') {
            last.pop();
        }
    }
    Ok(parts)
}

fn sequential(text: &str, out: &mut String) -> Result<(), ParseError> {
    let mut r = Renderer { out };
    parse(text, None, &mut r)?;
    r.finish(text);
    Ok(())
}

/// Byte ranges of `body` holding whole lines (each ends before a `\n` of `body` or at its end), about
/// `len / n` long each, the next starting after that `\n`; fewer when lines are long or few.
fn split(body: &str, n: usize) -> Vec<std::ops::Range<usize>> {
    let b = body.as_bytes();
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    for k in 1..n {
        let aim = (b.len() / n * k).max(start);
        let Some(nl) = b[aim..].iter().position(|&c| c == b'\n') else {
            break;
        };
        let end = aim + nl;
        out.push(start..end);
        start = end + 1;
    }
    out.push(start..b.len());
    out
}

/// Whether a table is open after `before` (whole lines, ending in `\n`), from its last lines: a
/// `COMMIT` closes, a table header, chain or rule line is only taken inside one; comments and
/// blank lines say nothing. Only a guess: [`roundtrip_into`] checks it.
fn guess_open(before: &str) -> Open {
    let before = before.strip_suffix('\n').unwrap_or(before);
    let mut lines = before.rsplit('\n');
    for _ in 0..GUESS_LINES {
        let Some(line) = lines.next() else {
            return Open::No;
        };
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        return if line == "COMMIT" {
            Open::No
        } else {
            Open::Before
        };
    }
    Open::Before
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cuts_at_line_ends() {
        let body = "a\nbb\nccc\ndddd\neeeee";
        for n in 1..10 {
            let chunks = split(body, n);
            let joined: Vec<&str> = chunks.iter().map(|r| &body[r.clone()]).collect();
            assert_eq!(joined.join("\n"), body, "n={n}");
            assert!(chunks.len() <= n);
        }
        assert_eq!(split("", 4), vec![std::ops::Range { start: 0, end: 0 }]);
        assert_eq!(
            split("one line", 4),
            vec![std::ops::Range { start: 0, end: 8 }]
        );
    }

    #[test]
    fn guess_reads_the_last_structural_line() {
        assert_eq!(guess_open(""), Open::No);
        assert_eq!(guess_open("# x\n\n"), Open::No);
        assert_eq!(guess_open("*filter\n"), Open::Before);
        assert_eq!(guess_open("*filter\n:A - [0:0]\n# c\n"), Open::Before);
        assert_eq!(guess_open("*filter\nCOMMIT\n# done\n\n"), Open::No);
        assert_eq!(guess_open("*filter\n-A INPUT -j ACCEPT\n"), Open::Before);
        // Only comments as far as it looks, with more before them: "open" (a guess).
        let many = format!("*filter\n{}", "# c\n".repeat(GUESS_LINES + 1));
        assert_eq!(guess_open(&many), Open::Before);
    }

    /// A dump of several tables cut anywhere: every cut's guess holds, so no chunk is parsed
    /// twice, and the output is the sequential one.
    #[test]
    fn guesses_hold_on_a_multi_table_dump() {
        let mut text = String::new();
        for t in ["filter", "nat", "mangle", "raw"] {
            text.push_str(&format!("# Generated by test\n*{t}\n:INPUT ACCEPT [0:0]\n"));
            for i in 0..40 {
                text.push_str(&format!("-A INPUT -s 10.0.0.{i}/32 -j ACCEPT\n"));
            }
            text.push_str("COMMIT\n# Completed\n\n");
        }
        let body = text.strip_suffix('\n').unwrap();
        let mut sequential_out = String::new();
        sequential(&text, &mut sequential_out).unwrap();
        for n in 2..=40 {
            let chunks = split(body, n);
            let mut open = Open::No;
            for (k, c) in chunks.iter().enumerate() {
                if k > 0 {
                    assert_eq!(
                        guess_open(&body[..c.start]) != Open::No,
                        open != Open::No,
                        "n={n} k={k}"
                    );
                }
                let mut out = String::new();
                open = parse_lines(
                    &body[c.clone()],
                    if open == Open::No {
                        Open::No
                    } else {
                        Open::Before
                    },
                    None,
                    &mut Renderer { out: &mut out },
                )
                .unwrap();
            }
            assert_eq!(
                roundtrip_save_parts(&text, n).unwrap().concat(),
                sequential_out
            );
        }
    }
}
