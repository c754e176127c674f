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
/// itself when it exists; otherwise it has to be created, in its nearest existing ancestor,
/// which is named (a `chown -R` of that ancestor could take a whole system directory).
fn hint(dir: &Path, owner: &str) -> String {
    let parent = nearest_existing(dir);
    let tail = "where it lives (on the host, for a bind-mounted directory), or run the server \
                as the directory's owner";
    if parent == dir {
        format!(
            "the data directory must be writable by this server's user ({owner}): \
             `chown -R {owner} {}` {tail}",
            dir.display()
        )
    } else {
        format!(
            "the data directory does not exist and this server's user ({owner}) cannot create \
             it in {}: `mkdir -p {dir} && chown -R {owner} {dir}` {tail}",
            parent.display(),
            dir = dir.display()
        )
    }
}

/// `dir` if it is known to exist, else its nearest ancestor that is: the current directory
/// (`.`) for a relative path none of whose ancestors does. A path that cannot be looked at (a
/// parent this user may not search) counts as missing.
fn nearest_existing(dir: &Path) -> PathBuf {
    dir.ancestors()
        .map(|path| {
            if path.as_os_str().is_empty() {
                Path::new(".")
            } else {
                path
            }
        })
        .find(|path| path.try_exists().unwrap_or(false))
        .unwrap_or(Path::new("."))
        .to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_existing_data_directory_is_itself_given_to_the_user() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(nearest_existing(tmp.path()), tmp.path());
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
        assert_eq!(nearest_existing(&dir), tmp.path());
        std::fs::create_dir(tmp.path().join("rootonly")).unwrap();
        assert_eq!(nearest_existing(&dir), tmp.path().join("rootonly"));
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
    fn a_relative_path_with_no_existing_parent_names_the_current_directory() {
        let dir = Path::new("no-such-directory-anywhere/sub");
        assert_eq!(nearest_existing(dir), Path::new("."));
        assert_eq!(nearest_existing(Path::new("/")), Path::new("/"));
    }
}
