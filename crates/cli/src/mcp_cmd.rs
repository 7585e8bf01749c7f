//! `deskfs mcp AGENT [--read-only]`: the desk's MCP tools over stdin/stdout for a local
//! MCP client (the same tools `deskfs serve` offers at `/mcp`; see the deskfs-serve
//! crate's `mcp` module). stdout carries only the protocol; messages go to stderr.

use anyhow::{anyhow, Context, Result};
use clap::Args;
use deskfs_serve::api::App;
use deskfs_serve::tokens::{Grant, Scope};

use crate::desk_root::RootArgs;

/// Arguments of `deskfs mcp`.
#[derive(Args, Debug)]
pub struct McpArgs {
    #[command(flatten)]
    pub root: RootArgs,
    /// Agent whose desk the tools work on.
    pub agent: String,
    /// Reads only: tools that would change the desk or run commands are refused.
    #[arg(long)]
    pub read_only: bool,
}

/// Runs `deskfs mcp` until the client closes stdin.
pub fn run(a: McpArgs) -> Result<()> {
    let desk = a.root.open(&a.agent)?;
    let root = a.root.resolve()?;
    let grant = Grant {
        agent: desk.agent().to_owned(),
        scope: if a.read_only {
            Scope::ReadOnly
        } else {
            Scope::ReadWrite
        },
        id: "local".to_owned(),
        desk_created: Some(desk.meta().created),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("deskfs-mcp")
        .build()
        .context("cannot start the MCP server's runtime")?;
    let app = App::new(&root).with_exec(crate::serve_cmd::exec_host());
    rt.block_on(deskfs_serve::mcp::serve_stdio(app, grant))
        .map_err(|e| anyhow!(e))
}
