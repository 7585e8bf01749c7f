//! `deskfs completions SHELL` and `deskfs man`: shell completions and man pages generated
//! from the command line's own definition (clap), so they never drift from it.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Command};

/// Arguments of `deskfs completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `deskfs man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write `deskfs.1` and one page per subcommand (`deskfs-mount.1`, …) into DIR
    /// (created when missing) instead of printing `deskfs.1` on stdout.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// Prints the completion script for `a.shell` on stdout.
pub fn completions(a: CompletionsArgs, mut cmd: Command) -> Result<()> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cmd, "deskfs", &mut out);
    out.flush().context("cannot write the completion script")
}

/// Prints `deskfs.1`, or writes every page into `a.out_dir`.
pub fn man(a: ManArgs, cmd: Command) -> Result<()> {
    let cmd = cmd.name("deskfs");
    let Some(dir) = a.out_dir else {
        let mut out = std::io::stdout().lock();
        clap_mangen::Man::new(cmd)
            .render(&mut out)
            .context("cannot write the man page")?;
        return out.flush().context("cannot write the man page");
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create man page dir {}", dir.display()))?;
    let mut n = 0;
    write_pages(&dir, cmd, "deskfs", &mut n)?;
    println!("wrote {n} man pages into {}", dir.display());
    Ok(())
}

/// Writes `name.1` for `cmd` and, recursively, `name-SUB.1` for its visible subcommands.
fn write_pages(dir: &Path, cmd: Command, name: &str, n: &mut usize) -> Result<()> {
    let cmd = cmd.name(name.to_string());
    let path = dir.join(format!("{name}.1"));
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut buf)
        .with_context(|| format!("cannot render {}", path.display()))?;
    std::fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
    *n += 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        write_pages(dir, sub.clone(), &sub_name, n)?;
    }
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::*;
    use clap::CommandFactory;

    /// The bash script, loaded into a real bash, completes subcommands and their options.
    #[test]
    fn bash_completion_completes_subcommands_and_options() {
        let mut script = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut crate::Cli::command(),
            "deskfs",
            &mut script,
        );
        let dir = crate::home::test_dir("completions");
        let path = dir.join("deskfs.bash");
        std::fs::write(&path, &script).unwrap();
        let complete = |words: &str| -> String {
            let prog = format!(
                "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
                 COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; \
                 _deskfs deskfs \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; \
                 printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                path.display()
            );
            let out = std::process::Command::new("bash")
                .args(["--norc", "-c", &prog])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let subs = complete("deskfs mo");
        assert_eq!(subs.trim(), "mount", "completing `deskfs mo`");
        let opts = complete("deskfs mount work /mnt --cache-d");
        assert_eq!(
            opts.trim(),
            "--cache-dir",
            "completing `--cache-d` of mount"
        );
        assert!(
            !complete("deskfs ").contains("daemon"),
            "the hidden daemon command is offered"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// One page per visible command, each a man(7) page naming its command.
    #[test]
    fn man_pages_cover_every_visible_command() {
        let dir = crate::home::test_dir("man");
        man(
            ManArgs {
                out_dir: Some(dir.clone()),
            },
            crate::Cli::command(),
        )
        .unwrap();
        fn count(c: &Command) -> usize {
            1 + c
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(count)
                .sum::<usize>()
        }
        let pages: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(pages.len(), count(&crate::Cli::command()));
        let mount = std::fs::read_to_string(dir.join("deskfs-mount.1")).unwrap();
        assert!(
            mount.contains(".TH deskfs-mount 1"),
            "{}",
            &mount[..200.min(mount.len())]
        );
        assert!(
            mount.contains("cache\\-dir"),
            "the mount page lists --cache-dir"
        );
        assert!(!dir.join("deskfs-daemon.1").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
