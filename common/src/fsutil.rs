//! Writing files so that no reader ever sees half of one, and a private
//! file is never readable by others, even for a moment. A leaf: it imports
//! nothing of this crate.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The directory `path` is written in: its parent, or the current
/// directory for a bare file name (`Path::parent` gives `""` for one).
pub fn parent_dir(path: &Path) -> io::Result<&Path> {
    match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Ok(Path::new(".")),
        Some(p) => Ok(p),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path has no parent",
        )),
    }
}

/// Writes `content` to `path` atomically with the given permission bits,
/// creating missing parent directories with mode 0755.
pub fn write_atomic(path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
    let dir = parent_dir(path)?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".drover-tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // Set the final mode explicitly: the creation mode is subject to the
        // umask, and a private file must never be readable, even briefly.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(content)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_file_name_is_written_in_the_current_directory() {
        assert_eq!(parent_dir(Path::new("boot.yaml")).unwrap(), Path::new("."));
        assert_eq!(
            parent_dir(Path::new("a/boot.yaml")).unwrap(),
            Path::new("a")
        );
        assert!(parent_dir(Path::new("/")).is_err());
        // A relative path is written relative to the current directory,
        // which the test does not change: write into a temporary one by
        // its relative name from here.
        let dir = tempfile::tempdir_in(".").unwrap();
        let name = dir.path().file_name().unwrap();
        let rel = Path::new(name).join("boot.yaml");
        write_atomic(&rel, b"x", 0o600).unwrap();
        assert_eq!(fs::read(dir.path().join("boot.yaml")).unwrap(), b"x");
    }
}
