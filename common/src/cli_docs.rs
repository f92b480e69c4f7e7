//! Shell completions and man pages of a binary's command line (clap's
//! `Command`), which `drover completion` and the packages use.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A shell completions are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// `cmd`'s completion script for `shell`.
pub fn completion(cmd: &mut clap::Command, shell: Shell) -> Vec<u8> {
    let name = cmd.get_name().to_owned();
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, cmd, name, &mut out);
    out
}

/// Writes one man page for `cmd` and one for each visible subcommand, at
/// any depth (`drover.1`, `drover-serve.1`, `drover-rollout-status.1`),
/// into `dir`; returns the files written.
pub fn man_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut cmd = cmd;
    cmd.build();
    write_pages(&cmd, cmd.get_name(), dir, &mut written)?;
    Ok(written)
}

/// `NAME completion SHELL`: prints `cmd`'s completion script for `shell`.
pub fn print_completion(mut cmd: clap::Command, shell: Shell) -> ExitCode {
    let script = completion(&mut cmd, shell);
    // A closed pipe (`| head`) is the reader's choice, not a failure.
    let _ = std::io::stdout().write_all(&script);
    ExitCode::SUCCESS
}

/// `NAME man DIR`: writes `cmd`'s man pages into `dir` ([`man_pages`]) and
/// says how many, or why not.
pub fn write_man_pages(cmd: clap::Command, dir: &Path) -> ExitCode {
    let name = cmd.get_name().to_owned();
    match man_pages(cmd, dir) {
        Ok(pages) => {
            println!("{} man pages written to {}", pages.len(), dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name} man: cannot write into {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

fn write_pages(
    cmd: &clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    let page = cmd.clone().name(name.to_owned());
    let mut text = Vec::new();
    clap_mangen::Man::new(page).render(&mut text)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, text)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> clap::Command {
        clap::Command::new("tool")
            .about("A tool.")
            .subcommand(
                clap::Command::new("serve")
                    .about("Serve.")
                    .subcommand(clap::Command::new("now").about("Now.")),
            )
            .subcommand(clap::Command::new("secret").hide(true))
    }

    #[test]
    fn a_page_per_visible_command_and_completions_per_shell() {
        let dir = tempfile::tempdir().unwrap();
        let pages = man_pages(cmd(), dir.path()).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["tool.1", "tool-serve.1", "tool-serve-now.1"]);
        let page = std::fs::read_to_string(&pages[1]).unwrap();
        assert!(page.contains(".TH tool-serve 1"), "{page}");
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let text = String::from_utf8(completion(&mut cmd(), shell)).unwrap();
            assert!(text.contains("serve"), "{shell:?}: {text}");
        }
    }
}
