//! The iptables-save corpus kept in the repository at `testdata/iptables-corpus/`: real dumps from
//! public sources (`NNN-slug.txt`) and what iptables-save 1.8.9 printed after loading each into a
//! fresh namespace (`NNN-slug.kernel.txt`). `SOURCES.md` there names every source and what the
//! kernel normalised. The one place every test and bench finds the corpus.

use std::path::PathBuf;

/// The corpus directory. Panics naming the path when it (or its `SOURCES.md`) is missing, so a
/// broken checkout fails loudly instead of a test silently finding no files.
pub fn iptables_corpus_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/iptables-corpus"
    ));
    assert!(
        dir.join("SOURCES.md").is_file(),
        "iptables corpus missing at {} (it is part of the repository: testdata/iptables-corpus)",
        dir.display()
    );
    dir
}

/// One file of the corpus, e.g. `"002-calico-felix-cali-raw-nat-mangle-filter.kernel.txt"`.
pub fn iptables_corpus_file(name: &str) -> PathBuf {
    iptables_corpus_dir().join(name)
}
