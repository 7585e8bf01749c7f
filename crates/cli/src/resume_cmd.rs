//! `deskfs resume AGENT`: what an agent reads first in a session.

use anyhow::Result;
use clap::Args;
use deskfs_desk::resume::resume;

use crate::desk_root::RootArgs;

/// Arguments of `deskfs resume`.
#[derive(Args, Debug)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub root: RootArgs,
    /// Agent name.
    pub agent: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// Runs `deskfs resume`.
pub fn run(a: ResumeArgs) -> Result<()> {
    let desk = a.root.open(&a.agent)?;
    let r = resume(&desk)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.to_text());
    }
    Ok(())
}
