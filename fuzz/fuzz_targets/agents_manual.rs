//! The `AGENTS.md` machine block (`deskfs_desk::manual`).
//!
//! For any text, `Manual::parse` returns a manual or an error, never panics. For a parsed
//! manual and any machine part `mp` (any tool and repo entries, any strings), `render`
//! either refuses `mp` in an error or gives a file that:
//! - parses again, with exactly `mp` as its machine part;
//! - keeps the human part byte for byte: with a block, the same `human()` (the text before
//!   and after the block); without one, the file as it was, then the appended block;
//! - renders to itself again with `mp` (a second `manual record` changes nothing).
//!
//! Input: a file's text (corpus files are `AGENTS.md` files: the template of a new desk,
//! recorded tools and repos, hand edits, broken blocks). Recorded into it: its own machine
//! part, and one read by `arbitrary` from the same bytes; and that second part's block
//! written by deskfs into the middle of the text, recorded over with both.

#![no_main]

use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};
use deskfs_desk::manual::{MachinePart, Manual, RepoEntry, ToolEntry};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct ArbTool {
    name: String,
    version: String,
    version_cmd: String,
    recorded: Option<String>,
}

#[derive(Arbitrary, Debug)]
struct ArbRepo {
    name: String,
    test_cmd: Option<String>,
    build_cmd: Option<String>,
}

#[derive(Arbitrary, Debug)]
struct ArbMachine {
    tools: Vec<ArbTool>,
    repos: Vec<ArbRepo>,
}

impl ArbMachine {
    fn part(self) -> MachinePart {
        MachinePart {
            tools: self
                .tools
                .into_iter()
                .map(|t| ToolEntry {
                    name: t.name,
                    version: t.version,
                    version_cmd: t.version_cmd,
                    recorded: t.recorded,
                })
                .collect(),
            repos: self
                .repos
                .into_iter()
                .map(|r| RepoEntry {
                    name: r.name,
                    test_cmd: r.test_cmd,
                    build_cmd: r.build_cmd,
                })
                .collect(),
        }
    }
}

const P: &str = "AGENTS.md";

fn record(text: String, mp: MachinePart) {
    let p = Path::new(P);
    let Ok(m) = Manual::parse(p, text.clone()) else {
        return;
    };
    assert_eq!(m.text(), text);
    let had_block = m.human() != text;
    let Ok(out) = m.render(p, &mp) else {
        return;
    };
    let m2 = Manual::parse(p, out.clone())
        .unwrap_or_else(|e| panic!("the file deskfs wrote does not parse: {e}\n{out:?}"));
    assert_eq!(
        m2.machine, mp,
        "machine part changed by a write and a read\n{out:?}"
    );
    if had_block {
        assert_eq!(m2.human(), m.human(), "human part changed\n{out:?}");
    } else {
        assert!(
            out.starts_with(&text),
            "text before an appended block changed"
        );
        let sep = if text.is_empty() || text.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        assert_eq!(
            m2.human(),
            format!("{text}{sep}\n\n"),
            "human part changed\n{out:?}"
        );
    }
    let again = m2
        .render(p, &mp)
        .expect("a machine part written once is written again");
    assert_eq!(again, out, "a second write changed the file");
}

fuzz_target!(|data: &[u8]| {
    let p = Path::new(P);
    let text = String::from_utf8_lossy(data).into_owned();
    let own = Manual::parse(p, text.clone()).ok().map(|m| m.machine);
    let arb = ArbMachine::arbitrary(&mut Unstructured::new(data))
        .map(ArbMachine::part)
        .unwrap_or_default();
    if let Some(own) = &own {
        record(text.clone(), own.clone());
    }
    record(text.clone(), arb.clone());
    // A block deskfs wrote, with prose around it.
    let Ok(block) = Manual::parse(p, String::new())
        .expect("an empty manual parses")
        .render(p, &arb)
    else {
        return;
    };
    let mut mid = text.len() / 2;
    while !text.is_char_boundary(mid) {
        mid -= 1;
    }
    let around = format!("{}{block}{}", &text[..mid], &text[mid..]);
    record(around.clone(), arb);
    record(around, own.unwrap_or_default());
});
