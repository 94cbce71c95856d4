//! The flow log file: JSON lines appended to `PATH`, rotated by size. When a line would take
//! the file past its size limit, `PATH.{keep-1}` is deleted, `PATH.i` becomes `PATH.{i+1}` and
//! `PATH` becomes `PATH.1`: at most `keep` files (`PATH` and `PATH.1 … PATH.{keep-1}`) exist.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A size-rotated JSON lines file.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: File,
    size: u64,
}

fn numbered(path: &Path, i: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{i}"));
    PathBuf::from(s)
}

impl RotatingFile {
    /// Opens (appending) `path`; `keep` ≥ 1 files of at most `max_bytes` each (a single line
    /// longer than that still gets a file of its own).
    pub fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<RotatingFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep: keep.max(1),
            file,
            size,
        })
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 1 {
            self.file.set_len(0)?;
        } else {
            let _ = std::fs::remove_file(numbered(&self.path, self.keep - 1));
            for i in (1..self.keep - 1).rev() {
                let from = numbered(&self.path, i);
                if from.exists() {
                    std::fs::rename(&from, numbered(&self.path, i + 1))?;
                }
            }
            std::fs::rename(&self.path, numbered(&self.path, 1))?;
            self.file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
        }
        self.size = 0;
        Ok(())
    }

    /// Appends lines (each gets a newline), rotating first when a line would not fit.
    pub fn write_lines<'a>(&mut self, lines: impl IntoIterator<Item = &'a str>) -> io::Result<()> {
        let mut buf = Vec::new();
        for line in lines {
            let len = line.len() as u64 + 1;
            if self.size + buf.len() as u64 + len > self.max_bytes
                && self.size + buf.len() as u64 > 0
            {
                self.file.write_all(&buf)?;
                buf.clear();
                self.rotate()?;
            }
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
        }
        self.file.write_all(&buf)?;
        self.size += buf.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_at_most_keep_files_of_at_most_max_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flows.jsonl");
        let mut f = RotatingFile::open(&path, 100, 3).unwrap();
        let line = "x".repeat(39);
        for _ in 0..20 {
            f.write_lines([line.as_str()]).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["flows.jsonl", "flows.jsonl.1", "flows.jsonl.2"]);
        for n in &names {
            let text = std::fs::read_to_string(dir.path().join(n)).unwrap();
            assert!(text.len() <= 100, "{n}: {}", text.len());
            assert!(text.lines().all(|l| l == line), "{n}");
        }
    }
}
