//! What to do when the data directory is not writable by this process: the usual cause is a
//! directory bind-mounted into the container, which runs as nobody (65534).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use broker_server::{Config, ServerError};
use broker_storage::StorageError;

/// `error` with the hint of [`hint`] when it is a permission denied on the data directory.
pub(crate) fn with_ownership_hint(error: ServerError, config: &Config) -> anyhow::Error {
    let denied = matches!(
        &error,
        ServerError::Storage(StorageError::Io { cause, .. })
            if cause.kind() == std::io::ErrorKind::PermissionDenied
    );
    let Some(dir) = config.data_dir.as_ref().filter(|_| denied) else {
        return error.into();
    };
    // Linux shows a process's effective user and group as the owner of /proc/self.
    let owner =
        std::fs::metadata("/proc/self").map(|meta| format!("{}:{}", meta.uid(), meta.gid()));
    match owner {
        Ok(owner) => anyhow::anyhow!("{error}; {}", hint(dir, &owner)),
        Err(_) => anyhow::anyhow!(
            "{error}; the data directory must be writable by this server's user: change its \
             owner, or run the server as the directory's owner"
        ),
    }
}

/// What the user `owner` (`UID:GID`) must be given for `dir` to be its data directory: `dir`
/// itself when it exists (write permission when the user owns it already, else ownership);
/// otherwise it has to be created, in its nearest existing ancestor, which is named (a
/// `chown -R` of that ancestor could take a whole system directory); or, when an ancestor
/// cannot be looked into, the right to search that ancestor.
fn hint(dir: &Path, owner: &str) -> String {
    let tail = "where it lives (on the host, for a bind-mounted directory), or run the server \
                as the directory's owner";
    match nearest_existing(dir) {
        Ancestor::Hidden(parent) => format!(
            "this server's user ({owner}) may not look inside {parent}: every directory above \
             the data directory must be searchable by it: `chmod o+x {parent}` where it lives \
             (on the host, for a bind-mounted directory), or run the server as a user that may",
            parent = parent.display()
        ),
        Ancestor::Exists(found) if found == dir => {
            let owned = std::fs::metadata(dir)
                .is_ok_and(|meta| format!("{}:{}", meta.uid(), meta.gid()) == owner);
            if owned {
                format!(
                    "the data directory belongs to this server's user ({owner}) but is not \
                     writable: `chmod u+rwx {}` {tail}",
                    dir.display()
                )
            } else {
                format!(
                    "the data directory must be writable by this server's user ({owner}): \
                     `chown -R {owner} {}` {tail}",
                    dir.display()
                )
            }
        }
        Ancestor::Exists(parent) => format!(
            "the data directory does not exist and this server's user ({owner}) cannot create \
             it in {}: `mkdir -p {dir} && chown -R {owner} {dir}` {tail}",
            parent.display(),
            dir = dir.display()
        ),
    }
}

/// The nearest of a path and its ancestors that this user can tell exists.
#[derive(Debug, PartialEq, Eq)]
enum Ancestor {
    /// It exists (the path itself, or its nearest existing ancestor: the current directory
    /// (`.`) for a relative path none of whose ancestors does).
    Exists(PathBuf),
    /// This directory exists but this user may not look inside it (search permission), so
    /// whether what is below it exists cannot be told.
    Hidden(PathBuf),
}

/// Where `dir` or its nearest ancestor is, as far as this user can tell.
fn nearest_existing(dir: &Path) -> Ancestor {
    nearest_existing_by(dir, Path::try_exists)
}

/// [`nearest_existing`], with `exists` telling whether a path exists (an error: it cannot be
/// looked at).
fn nearest_existing_by(dir: &Path, exists: impl Fn(&Path) -> std::io::Result<bool>) -> Ancestor {
    let paths: Vec<&Path> = dir
        .ancestors()
        .map(|path| {
            if path.as_os_str().is_empty() {
                Path::new(".")
            } else {
                path
            }
        })
        .collect();
    for (index, path) in paths.iter().enumerate() {
        match exists(path) {
            Ok(true) => return Ancestor::Exists(path.to_path_buf()),
            Ok(false) => {}
            // Its parent may not be searched: that parent is the obstacle.
            Err(_) => {
                let parent = paths.get(index + 1).copied().unwrap_or(Path::new("."));
                return Ancestor::Hidden(parent.to_path_buf());
            }
        }
    }
    Ancestor::Exists(PathBuf::from("."))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_existing_data_directory_is_itself_given_to_the_user() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(
            nearest_existing(tmp.path()),
            Ancestor::Exists(tmp.path().to_path_buf())
        );
        let hint = hint(tmp.path(), "65534:65534");
        assert!(
            hint.contains(&format!("`chown -R 65534:65534 {}`", tmp.path().display())),
            "{hint}"
        );
    }

    #[test]
    fn a_missing_data_directory_names_its_nearest_existing_parent() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("rootonly").join("sub");
        assert_eq!(
            nearest_existing(&dir),
            Ancestor::Exists(tmp.path().to_path_buf())
        );
        std::fs::create_dir(tmp.path().join("rootonly")).unwrap();
        assert_eq!(
            nearest_existing(&dir),
            Ancestor::Exists(tmp.path().join("rootonly"))
        );
        let hint = hint(&dir, "65534:65534");
        assert!(
            hint.contains(&format!(
                "cannot create it in {}: `mkdir -p {dir} && chown -R 65534:65534 {dir}`",
                tmp.path().join("rootonly").display(),
                dir = dir.display()
            )),
            "{hint}"
        );
    }

    #[test]
    fn a_directory_the_user_owns_already_is_given_write_permission() {
        let tmp = tempfile::tempdir().unwrap();
        let meta = std::fs::metadata(tmp.path()).unwrap();
        let owner = format!("{}:{}", meta.uid(), meta.gid());
        let hint = hint(tmp.path(), &owner);
        assert!(
            hint.contains(&format!(
                "not writable: `chmod u+rwx {}`",
                tmp.path().display()
            )),
            "{hint}"
        );
    }

    #[test]
    fn an_ancestor_that_cannot_be_searched_is_named() {
        // /srv/closed exists, and looking inside it is denied.
        let exists = |path: &Path| match path.to_str() {
            Some("/srv/closed/data") => Err(std::io::ErrorKind::PermissionDenied.into()),
            _ => Ok(true),
        };
        assert_eq!(
            nearest_existing_by(Path::new("/srv/closed/data"), exists),
            Ancestor::Hidden(PathBuf::from("/srv/closed"))
        );
    }

    #[test]
    fn a_relative_path_with_no_existing_parent_names_the_current_directory() {
        let dir = Path::new("no-such-directory-anywhere/sub");
        assert_eq!(nearest_existing(dir), Ancestor::Exists(PathBuf::from(".")));
        assert_eq!(
            nearest_existing(Path::new("/")),
            Ancestor::Exists(PathBuf::from("/"))
        );
    }
}
