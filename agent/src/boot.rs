//! Reading a bootstrap document from a file (`--bootstrap FILE`, and the
//! simulator's `--bootstrap`).

use std::path::Path;

use anyhow::Context;
use drover_common::wire::BootstrapDocument;

/// Reads and parses the bootstrap document at `path`; the error names the
/// file.
pub fn read_bootstrap(path: &Path) -> anyhow::Result<BootstrapDocument> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the bootstrap document {}", path.display()))?;
    BootstrapDocument::parse(&text)
        .with_context(|| format!("invalid bootstrap document {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_errors_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.yaml");
        let err = read_bootstrap(&missing).unwrap_err();
        assert!(
            format!("{err:#}").contains("cannot read the bootstrap document"),
            "{err:#}"
        );
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "apiVersion: drover.dev/v1alpha1\nkind: Nope\n").unwrap();
        let err = format!("{:#}", read_bootstrap(&bad).unwrap_err());
        assert!(err.contains("invalid bootstrap document"), "{err}");
    }
}
