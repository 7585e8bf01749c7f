//! Finding the bubblewrap binary.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use crate::SandboxError;

/// The PATH searched when the caller has none (the shell's default).
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Looks `bwrap` up in a PATH-style list of directories (`:`-separated; `None` means the
/// default `/usr/local/bin:/usr/bin:/bin`; empty entries are skipped, not read as the
/// current directory). Returns the first regular file named `bwrap` with an execute bit.
///
/// # Errors
/// [`SandboxError::BwrapMissing`] when no directory holds one.
pub fn find_bwrap_in(path_var: Option<&OsStr>) -> Result<PathBuf, SandboxError> {
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    std::env::split_paths(path_var)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join("bwrap"))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .ok_or(SandboxError::BwrapMissing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_path_means_missing() {
        let err = find_bwrap_in(Some(OsStr::new(""))).unwrap_err();
        assert!(matches!(err, SandboxError::BwrapMissing));
        assert_eq!(
            err.to_string(),
            "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
        );
    }

    #[test]
    fn non_executable_file_is_not_bwrap() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("bwrap");
        std::fs::write(&fake, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(find_bwrap_in(Some(dir.path().as_os_str())).is_err());
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_bwrap_in(Some(dir.path().as_os_str())).unwrap(), fake);
    }
}
