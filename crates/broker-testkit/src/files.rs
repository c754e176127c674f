//! A data directory's files, read whole, to compare a directory before and after a start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file under `dir` (subdirectories included) but the locks, with its bytes. A start
/// writes its pid into `LOCK` before it reads anything else; no other file may change when it
/// is refused.
pub fn every_file(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(every_file(&path));
        } else if path.file_name().is_some_and(|name| name != "LOCK") {
            files.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    files
}
