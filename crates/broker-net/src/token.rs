//! Where the auth token comes from: a file (`--auth-token-file`) or the `BROKER_AUTH_TOKEN`
//! environment variable, never a command-line value (which any user could read in the process
//! list).

use std::path::{Path, PathBuf};

/// The environment variable holding the auth token itself.
pub const AUTH_TOKEN_ENV: &str = "BROKER_AUTH_TOKEN";

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Both a token file and the environment variable were given.
    #[error("give the auth token through --auth-token-file or {AUTH_TOKEN_ENV}, not both")]
    Both,
    /// The token file could not be read (or is not UTF-8).
    #[error("cannot read the auth token file {}: {cause}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The token is empty.
    #[error("the auth token {0} is empty")]
    Empty(String),
    /// The environment variable is not valid UTF-8.
    #[error("{AUTH_TOKEN_ENV} is not valid UTF-8")]
    NotUtf8,
}

/// The token in `path`: the file's content without trailing line breaks (so a file written by
/// `echo` works).
///
/// # Errors
/// [`TokenError::Unreadable`] or [`TokenError::Empty`].
pub fn read_token_file(path: &Path) -> Result<String, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|cause| TokenError::Unreadable {
        path: path.to_owned(),
        cause,
    })?;
    let token = text.trim_end_matches(['\r', '\n']);
    if token.is_empty() {
        return Err(TokenError::Empty(format!("file {}", path.display())));
    }
    Ok(token.to_owned())
}

/// The token from `file` (when given) or from [`AUTH_TOKEN_ENV`]; `None` when neither is set.
///
/// # Errors
/// [`TokenError::Both`] when both are set; otherwise as [`read_token_file`], or the variable is
/// empty or not UTF-8.
pub fn auth_token(file: Option<&Path>) -> Result<Option<String>, TokenError> {
    match (file, std::env::var_os(AUTH_TOKEN_ENV)) {
        (Some(_), Some(_)) => Err(TokenError::Both),
        (Some(path), None) => read_token_file(path).map(Some),
        (None, Some(token)) => {
            let token = token.into_string().map_err(|_| TokenError::NotUtf8)?;
            if token.is_empty() {
                return Err(TokenError::Empty(AUTH_TOKEN_ENV.to_owned()));
            }
            Ok(Some(token))
        }
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_token_file_loses_its_trailing_line_breaks_only() {
        let dir = std::env::temp_dir().join(format!("broker-net-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, " s3cret \r\n\n").unwrap();
        assert_eq!(read_token_file(&path).unwrap(), " s3cret ");
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(read_token_file(&path), Err(TokenError::Empty(_))));
        assert!(matches!(
            read_token_file(&dir.join("missing")),
            Err(TokenError::Unreadable { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
