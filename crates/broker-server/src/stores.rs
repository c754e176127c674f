//! A single broker's data directory, shard by shard (see `--shards`): shard 0 keeps the
//! directory's own files, as a broker of one shard always has, and shard `i` (from 1) the
//! directory `shards/<i>/` in it, laid out alike (its own lock, log, snapshots and record
//! segments). A directory written with one shard is a directory of one shard as it is.
//! `shards/count` says how many shards the directory holds (written, to a temporary file
//! then renamed, whenever a start adds shards), so that a missing shard directory is noticed
//! even when it is the last.

use std::fs;
use std::path::{Path, PathBuf};

use broker_storage::Storage;

use crate::shards::duplicate_topic;
use crate::{Config, ServerError};

/// Where the shards after the first keep their files, inside the data directory.
pub(crate) const SHARDS_DIR: &str = "shards";

/// The file of `shards/` that says how many shards the directory holds.
const COUNT_FILE: &str = "count";

/// A data directory opened and recovered by [`crate::open_storage`]: one [`Storage`] per
/// shard, shard 0 first.
#[derive(Debug)]
pub struct Stores {
    shards: Vec<Storage>,
}

impl Stores {
    /// The stores of the shards, shard 0 first.
    pub fn shards(&self) -> &[Storage] {
        &self.shards
    }

    /// The stores of the shards, shard 0 first, to be started.
    pub(crate) fn into_shards(self) -> Vec<Storage> {
        self.shards
    }
}

/// The directory of shard `shard` of the data directory `root`.
pub(crate) fn shard_dir(root: &Path, shard: usize) -> PathBuf {
    match shard {
        0 => root.to_owned(),
        _ => root.join(SHARDS_DIR).join(shard.to_string()),
    }
}

/// How many shards the data directory `root` holds: 1, and one more for each numbered
/// directory of `shards/`, which must be numbered from 1 without a gap, and as many as
/// `shards/count` says.
///
/// # Errors
/// `shards/` holds something else, a shard's directory is missing, or it cannot be listed.
fn shards_present(root: &Path) -> Result<usize, ServerError> {
    if root.exists() && !root.is_dir() {
        return Err(ServerError::InvalidConfig(format!(
            "the data directory {} is not a directory: give --data-dir a directory (it is \
             created if missing)",
            root.display()
        )));
    }
    let dir = root.join(SHARDS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(1),
        Err(error) => {
            return Err(ServerError::InvalidConfig(format!(
                "cannot list {}: {error}",
                dir.display()
            )))
        }
    };
    let mut numbers = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| {
            ServerError::InvalidConfig(format!("cannot list {}: {error}", dir.display()))
        })?;
        let name = entry.file_name();
        // The count, and what a start that died while writing it left (written again).
        if name == COUNT_FILE || name == format!("{COUNT_FILE}.tmp").as_str() {
            continue;
        }
        // Exactly the name shard `number` is opened by (not `01`, not `+1`).
        let number = name
            .to_str()
            .and_then(|name| Some((name, name.parse::<usize>().ok()?)))
            .filter(|(name, number)| *number >= 1 && *name == number.to_string())
            .map(|(_, number)| number)
            .filter(|_| entry.path().is_dir());
        match number {
            Some(number) => numbers.push(number),
            None => {
                return Err(ServerError::InvalidConfig(format!(
                    "{} holds {:?}, which is no shard's directory (shards are numbered \
                     directories, from 1): move it out of the data directory",
                    dir.display(),
                    name
                )))
            }
        }
    }
    numbers.sort_unstable();
    for (expected, number) in (1..).zip(&numbers) {
        if *number != expected {
            return Err(ServerError::InvalidConfig(format!(
                "{} has no shard {expected} but has shard {number}: a shard's directory is \
                 missing (restore it from a backup of the whole data directory)",
                dir.display()
            )));
        }
    }
    let present = numbers.len() + 1;
    if let Some(counted) = counted_shards(&dir)? {
        if present < counted {
            return Err(ServerError::InvalidConfig(format!(
                "{} holds {counted} shards ({}), but only the directories of shards 1 to {} are \
                 there: shard {present}'s directory is missing (restore it from a backup of \
                 the whole data directory)",
                dir.display(),
                dir.join(COUNT_FILE).display(),
                present - 1
            )));
        }
    }
    Ok(present)
}

/// What `shards/count` in `dir` says, if it exists.
fn counted_shards(dir: &Path) -> Result<Option<usize>, ServerError> {
    let path = dir.join(COUNT_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            ServerError::InvalidConfig(format!(
                "{} does not hold a number of shards: {:?}",
                path.display(),
                text.trim()
            ))
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(ServerError::InvalidConfig(format!(
            "cannot read {}: {error}",
            path.display()
        ))),
    }
}

/// Writes `count` to `shards/count` of `root` (a temporary file, fsynced, then renamed, and
/// the directory fsynced).
fn write_count(root: &Path, count: usize) -> std::io::Result<()> {
    let dir = root.join(SHARDS_DIR);
    let temporary = dir.join(format!("{COUNT_FILE}.tmp"));
    let mut file = fs::File::create(&temporary)?;
    std::io::Write::write_all(&mut file, format!("{count}\n").as_bytes())?;
    file.sync_all()?;
    fs::rename(&temporary, dir.join(COUNT_FILE))?;
    fs::File::open(&dir)?.sync_all()
}

/// Opens and recovers the shards of the data directory `root`: those it holds, then new ones
/// up to [`Config::shards`]. Each existing shard is checked by `check`, and no two may hold a
/// topic of the same name, before a new shard's directory is created, so that a refused start
/// creates nothing.
///
/// # Errors
/// The directory holds more shards than asked for (shards are never merged), a shard is
/// missing or cannot be opened, `check` refuses one, or two hold a topic of the same name.
pub(crate) fn open(
    root: &Path,
    config: &Config,
    check: impl Fn(&Path, &Storage) -> Result<(), ServerError>,
) -> Result<Stores, ServerError> {
    let present = shards_present(root)?;
    let wanted = match config.shards {
        None => present,
        Some(asked) if asked < present => {
            return Err(ServerError::InvalidConfig(format!(
                "{} holds topics in {present} shards, more than --shards {asked}: start it with \
                 --shards {present} or more (or without --shards); the topics of a shard are \
                 never moved to another",
                root.display()
            )))
        }
        Some(asked) => asked,
    };
    let mut shards = Vec::with_capacity(wanted);
    for shard in 0..present {
        let dir = shard_dir(root, shard);
        let storage = Storage::open(&dir, config.capacity)?;
        check(&dir, &storage)?;
        shards.push(storage);
    }
    let descriptions: Vec<_> = shards
        .iter()
        .map(|storage| storage.recovery().state.describe_all())
        .collect();
    let names = descriptions.iter().map(|description| {
        description
            .topics
            .iter()
            .map(|topic| topic.name.as_str())
            .collect()
    });
    if let Some((topic, first, second)) = duplicate_topic(names) {
        return Err(ServerError::InvalidConfig(format!(
            "{}: shards {first} and {second} both hold a topic named {topic:?}; a topic lives in \
             one shard (were shard directories copied?): restore the data directory from a \
             backup",
            root.display()
        )));
    }
    for shard in present..wanted {
        shards.push(Storage::open(&shard_dir(root, shard), config.capacity)?);
    }
    if wanted > present {
        write_count(root, wanted).map_err(|error| {
            ServerError::InvalidConfig(format!(
                "cannot record the number of shards in {}: {error}",
                root.join(SHARDS_DIR).display()
            ))
        })?;
    }
    Ok(Stores { shards })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn shards_are_numbered_directories_without_a_gap() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(shards_present(root.path()).unwrap(), 1);
        fs::create_dir_all(root.path().join("shards/1")).unwrap();
        fs::create_dir_all(root.path().join("shards/2")).unwrap();
        assert_eq!(shards_present(root.path()).unwrap(), 3);
        fs::create_dir_all(root.path().join("shards/4")).unwrap();
        let error = shards_present(root.path()).unwrap_err().to_string();
        assert!(error.contains("has no shard 3 but has shard 4"), "{error}");
        fs::create_dir_all(root.path().join("shards/03")).unwrap();
        let error = shards_present(root.path()).unwrap_err().to_string();
        assert!(error.contains("no shard's directory"), "{error}");
        fs::remove_dir(root.path().join("shards/03")).unwrap();
        fs::write(root.path().join("shards/notes"), "x").unwrap();
        let error = shards_present(root.path()).unwrap_err().to_string();
        assert!(error.contains("no shard's directory"), "{error}");
    }

    #[test]
    fn fewer_shards_than_the_directory_holds_are_refused_and_nothing_is_created() {
        let root = tempfile::tempdir().unwrap();
        let config = Config {
            shards: Some(3),
            ..Config::default()
        };
        let stores = open(root.path(), &config, |_, _| Ok(())).unwrap();
        assert_eq!(stores.shards().len(), 3);
        drop(stores);
        // Without --shards: as many as it holds.
        let stores = open(root.path(), &Config::default(), |_, _| Ok(())).unwrap();
        assert_eq!(stores.shards().len(), 3);
        drop(stores);
        let fewer = Config {
            shards: Some(2),
            ..Config::default()
        };
        let error = open(root.path(), &fewer, |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(error.contains("holds topics in 3 shards"), "{error}");
        // A check that refuses an existing shard stops the start before new shards exist.
        let more = Config {
            shards: Some(5),
            ..Config::default()
        };
        let refusing = |dir: &Path, _: &Storage| match dir.ends_with("shards/2") {
            true => Err(ServerError::InvalidConfig("refused".into())),
            false => Ok(()),
        };
        assert!(open(root.path(), &more, refusing).is_err());
        assert!(!root.path().join("shards/3").exists());
        // The last shard's directory gone: noticed, by the count the start that added it wrote.
        fs::remove_dir_all(root.path().join("shards/2")).unwrap();
        let error = open(root.path(), &Config::default(), |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(error.contains("shard 2's directory is missing"), "{error}");
    }
}
