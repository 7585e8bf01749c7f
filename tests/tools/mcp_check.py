#!/usr/bin/env python3
"""Checks deskfs's MCP server with the official MCP Python SDK (`mcp`), over stdio
(`deskfs mcp alice`) and over streamable HTTP (`deskfs serve`'s /mcp with bearer tokens).

Usage: mcp_check.py DESKFS ROOT BASE_URL TOKENS_JSON
  DESKFS       the deskfs binary
  ROOT         the desk root (alice's desk is ROOT/alice, with `out` -> a directory
               outside, `outfile` -> a file outside, and repos/app a git repository)
  BASE_URL     http://127.0.0.1:PORT of a running `deskfs serve --root ROOT`
  TOKENS_JSON  {"rw": alice read-write, "ro": alice read-only, "revoked": a revoked one}

Every check prints nothing when it passes; the first failure prints what was expected
and what came, and exits 1. The last line says how many checks passed.
"""

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

DESKFS, ROOT, BASE, TOKENS = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
DESK = os.path.join(ROOT, "alice")
CHECKS = 0

TOOLS = {
    "read_text_file": True, "read_multiple_files": True, "write_file": False,
    "edit_file": False, "create_directory": False, "list_directory": True,
    "list_directory_with_sizes": True, "directory_tree": True, "move_file": False,
    "search_files": True, "get_file_info": True, "list_allowed_directories": True,
    "task_start": False, "task_list": True, "task_finish": False, "resume": True,
    "memory": False, "exec": False, "journal": True,
}
# The desks are on a deskfs mount (the journal then knows each command's files).
ON_MOUNT = os.environ.get("MCP_CHECK_ON_MOUNT") == "1"


def check(cond, what):
    global CHECKS
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    CHECKS += 1


def text_of(r):
    return "".join(c.text for c in r.content if getattr(c, "type", "") == "text")


async def ok(s, tool, args, label=None):
    r = await s.call_tool(tool, args)
    check(not r.is_error, f"{label or tool} {args}: error result {text_of(r)!r}")
    return r


async def err(s, tool, args, code, label=None):
    r = await s.call_tool(tool, args)
    t = text_of(r)
    check(r.is_error, f"{label or tool} {args}: expected an error, got {t!r}")
    codes = code if isinstance(code, tuple) else (code,)
    check(any(t.startswith(f"Error [{c}]: ") for c in codes), f"{label or tool} {args}: expected code {code}, got {t!r}")
    return t


async def tool_list(s):
    tools = {t.name: t for t in (await s.list_tools()).tools}
    for name, ro in TOOLS.items():
        check(name in tools, f"tool {name} listed (got {sorted(tools)})")
        a = tools[name].annotations
        check(a is not None and a.read_only_hint is ro, f"{name}: readOnlyHint {ro} (got {a})")
    check(tools["write_file"].annotations.destructive_hint is True, "write_file is destructive")
    check(tools["create_directory"].annotations.idempotent_hint is True, "create_directory is idempotent")
    check(tools["exec"].annotations.destructive_hint is True and tools["exec"].annotations.open_world_hint is True,
          f"exec is destructive and open-world: {tools['exec'].annotations}")
    xs = tools["exec"].output_schema or {}
    check({"stdout", "stderr", "exit"} <= set(xs.get("properties", {})), f"exec output schema: {xs}")
    check({"command", "shell", "cwd", "env", "timeout_secs", "net"} <= set(tools["exec"].input_schema.get("properties", {})),
          f"exec input schema: {tools['exec'].input_schema}")
    schema = tools["read_text_file"].output_schema or {}
    check("content" in schema.get("properties", {}), f"read_text_file output schema: {schema}")
    props = tools["read_text_file"].input_schema.get("properties", {})
    check({"path", "head", "tail"} <= set(props), f"read_text_file input schema: {props}")


async def file_tools(s):
    """The reference filesystem server's tools on alice's desk."""
    r = await ok(s, "write_file", {"path": "/desk/notes/mcp.txt", "content": "a\nb\nc\n"})
    check(text_of(r) == "Successfully wrote to /desk/notes/mcp.txt", f"write_file said {text_of(r)!r}")
    with open(os.path.join(DESK, "notes/mcp.txt")) as f:
        check(f.read() == "a\nb\nc\n", "write_file content on the mount")
    r = await ok(s, "read_text_file", {"path": "notes/mcp.txt", "head": 2})
    check(text_of(r) == "a\nb", f"head: {text_of(r)!r}")
    check(r.structured_content == {"content": "a\nb"}, f"structured: {r.structured_content}")
    r = await ok(s, "read_text_file", {"path": "/desk/notes/mcp.txt", "tail": 1})
    check(text_of(r) == "c", f"tail: {text_of(r)!r}")
    await err(s, "read_text_file", {"path": "notes/mcp.txt", "head": 1, "tail": 1}, "bad_request")

    edit = {"path": "/desk/notes/mcp.txt", "edits": [{"oldText": "b", "newText": "B"}]}
    r = await ok(s, "edit_file", {**edit, "dryRun": True})
    d = text_of(r)
    check(d.startswith("```diff\nIndex: /desk/notes/mcp.txt\n"), f"diff head: {d!r}")
    check("--- /desk/notes/mcp.txt\toriginal\n+++ /desk/notes/mcp.txt\tmodified\n" in d, f"diff names: {d!r}")
    check("-b\n+B\n" in d and d.endswith("```\n\n"), f"diff body: {d!r}")
    with open(os.path.join(DESK, "notes/mcp.txt")) as f:
        check(f.read() == "a\nb\nc\n", "a dry run wrote nothing")
    await ok(s, "edit_file", edit)
    with open(os.path.join(DESK, "notes/mcp.txt")) as f:
        check(f.read() == "a\nB\nc\n", "edit_file applied")
    t = await err(s, "edit_file", edit, "not_found")
    check("Could not find exact match for edit:\nb" in t, f"edit mismatch text: {t!r}")

    r = await ok(s, "create_directory", {"path": "/desk/mcpdir/a/b"})
    check(text_of(r) == "Successfully created directory /desk/mcpdir/a/b", text_of(r))
    await ok(s, "create_directory", {"path": "/desk/mcpdir/a/b"}, "create_directory again")
    await ok(s, "write_file", {"path": "mcpdir/x.txt", "content": "12345"})
    r = await ok(s, "list_directory", {"path": "/desk/mcpdir"})
    check(text_of(r) == "[DIR] a\n[FILE] x.txt", f"list_directory: {text_of(r)!r}")
    r = await ok(s, "list_directory_with_sizes", {"path": "/desk/mcpdir", "sortBy": "size"})
    lines = text_of(r).split("\n")
    check(lines[0].startswith("[FILE] x.txt") and lines[0].endswith("5 B"), f"sizes: {lines}")
    check(lines[-2:] == ["Total: 1 files, 1 directories", "Combined size: 5 B"], f"totals: {lines}")
    r = await ok(s, "directory_tree", {"path": "/desk/mcpdir"})
    tree = json.loads(text_of(r))
    check(tree == [{"name": "a", "type": "directory", "children": [{"name": "b", "type": "directory", "children": []}]},
                   {"name": "x.txt", "type": "file"}], f"tree: {tree}")
    r = await ok(s, "search_files", {"path": "/desk", "pattern": "**/x.txt", "excludePatterns": ["repos"]})
    check(text_of(r) == "/desk/mcpdir/x.txt", f"search: {text_of(r)!r}")
    r = await ok(s, "search_files", {"path": "/desk/mcpdir", "pattern": "*.nothing"})
    check(text_of(r) == "No matches found", f"search none: {text_of(r)!r}")
    r = await ok(s, "get_file_info", {"path": "/desk/mcpdir/x.txt"})
    info = dict(line.split(": ", 1) for line in text_of(r).split("\n"))
    check(info.get("size") == "5" and info.get("isFile") == "true", f"info: {info}")
    r = await ok(s, "read_multiple_files", {"paths": ["/desk/mcpdir/x.txt", "/desk/none"]})
    parts = text_of(r).split("\n---\n")
    check(parts[0] == "/desk/mcpdir/x.txt:\n12345\n", f"multi 0: {parts}")
    check(parts[1].startswith("/desk/none: Error - "), f"multi 1: {parts}")
    r = await ok(s, "move_file", {"source": "/desk/mcpdir/x.txt", "destination": "mcpdir/y.txt"})
    check(text_of(r) == "Successfully moved /desk/mcpdir/x.txt to /desk/mcpdir/y.txt", text_of(r))
    await err(s, "move_file", {"source": "/desk/mcpdir/x.txt", "destination": "mcpdir/z.txt"}, "not_found")
    await ok(s, "write_file", {"path": "mcpdir/z.txt", "content": "z"})
    await err(s, "move_file", {"source": "mcpdir/y.txt", "destination": "mcpdir/z.txt"}, "exists")
    r = await ok(s, "list_allowed_directories", {})
    check(text_of(r) == "Allowed directories:\n/desk", text_of(r))


async def confinement(s):
    """No path leads out of the desk, through any tool."""
    for p, code in [("/etc/passwd", "outside_desk"), ("../bob/AGENTS.md", "outside_desk"),
                    ("/desk/../bob/AGENTS.md", "outside_desk"), ("/deskX/a", "outside_desk"),
                    ("out/secret.txt", "outside_desk"), ("outfile", "outside_desk"),
                    ("a\u0000b", "bad_path"), ("x" * 300, "name_too_long")]:
        await err(s, "read_text_file", {"path": p}, code, f"read {p[:40]!r}")
    await err(s, "write_file", {"path": "out/new.txt", "content": "x"}, "outside_desk", "write through a link out")
    await err(s, "list_directory", {"path": "out"}, "outside_desk", "list through a link out")
    # mkdir -p never looks through a link: the link is a name that is not a directory
    await err(s, "create_directory", {"path": "out/d"}, ("outside_desk", "exists"), "mkdir through a link out")
    await err(s, "move_file", {"source": "notes/mcp.txt", "destination": "out/stolen"}, "outside_desk")
    await err(s, "get_file_info", {"path": "/root"}, "outside_desk")
    r = await ok(s, "search_files", {"path": "/desk", "pattern": "**/secret.txt"})
    check(text_of(r) == "No matches found", f"search followed a link out: {text_of(r)!r}")
    outside = os.path.dirname(os.path.realpath(os.path.join(DESK, "outfile")))
    check(sorted(os.listdir(outside)) == ["secret.txt"], f"written outside: {os.listdir(outside)}")


async def desk_tools(s):
    r = await ok(s, "memory", {"command": "create", "path": "/memories/mcp.md", "file_text": "one\ntwo\n"})
    with open(os.path.join(DESK, "memories/mcp.md")) as f:
        check(f.read() == "one\ntwo\n", "memory create over MCP")
    r = await ok(s, "memory", {"command": "view", "path": "/memories/mcp.md"})
    check("     1\tone" in text_of(r), f"memory view: {text_of(r)!r}")
    r = await s.call_tool("memory", {"command": "view", "path": "/memoriesX/a"})
    check(r.is_error, f"memory escape: {text_of(r)!r}")
    r = await ok(s, "resume", {})
    check(isinstance(r.structured_content, dict) and "tasks" in r.structured_content,
          f"resume structured: {str(r.structured_content)[:200]}")
    r = await ok(s, "task_start", {"task": "mcp-task", "repo": "app"})
    check(os.path.isdir(os.path.join(DESK, "tasks/mcp-task")), "task_start made the worktree")
    r = await ok(s, "task_list", {})
    names = [t.get("task") or t.get("name") for t in r.structured_content["tasks"]]
    check("mcp-task" in names, f"task_list: {r.structured_content}")
    await err(s, "task_start", {"task": "mcp-task", "repo": "app"}, "exists")
    await err(s, "task_start", {"task": "t2", "repo": "nope"}, "not_found")
    await ok(s, "task_finish", {"task": "mcp-task"})
    check(not os.path.exists(os.path.join(DESK, "tasks/mcp-task")), "task_finish removed the worktree")


async def exec_tools(s, how):
    """The exec tool runs next to the data and is journaled (via mcp) with its files."""
    with open(os.path.join(DESK, f"notes/{how}-edit"), "w") as f:
        f.write("before\n")
    script = f"echo made > notes/{how}-new; echo more >> notes/{how}-edit; echo out; echo err >&2; exit 3"
    r = await ok(s, "exec", {"shell": script}, f"{how}: exec")
    x = r.structured_content
    check(x["exit"]["code"] == 3 and x["stdout"] == "out\n" and x["stderr"] == "err\n"
          and not x["stdout_truncated"] and not x["exit"]["killed"], f"{how}: exec result {x}")
    t = text_of(r)
    check(t.startswith("exit 3 in ") and "--- stdout ---\nout\n" in t and "--- stderr ---\nerr\n" in t, f"{how}: exec text {t!r}")
    with open(os.path.join(DESK, f"notes/{how}-new")) as f:
        check(f.read() == "made\n", f"{how}: the command's file is in the desk")
    jid = x["exit"].get("journal_id")
    r = await ok(s, "journal", {"task": "_desk", "limit": 3}, f"{how}: journal")
    es = [e for e in r.structured_content["entries"] if e["id"] == jid]
    check(len(es) == 1, f"{how}: the exec {jid} is in the journal: {r.structured_content}")
    e = es[0]
    check(e["via"] == "mcp" and e["command"] == ["sh", "-c", script] and e["exit_code"] == 3
          and e["output"] in ("out\nerr\n", "err\nout\n"), f"{how}: journal entry {e}")
    if ON_MOUNT:
        check(e["files"] == {"created": [f"notes/{how}-new"], "changed": [f"notes/{how}-edit"], "deleted": []},
              f"{how}: the entry lists the command's files: {e['files']} {e.get('changes_unknown')}")
    r = await ok(s, "exec", {"command": ["pwd"], "cwd": "repos/app"}, f"{how}: exec argv in a cwd")
    check(r.structured_content["stdout"] == "/desk/repos/app\n", f"{how}: cwd {r.structured_content}")
    r = await ok(s, "exec", {"shell": "sleep 30", "timeout_secs": 1}, f"{how}: exec timeout")
    check(r.structured_content["exit"]["timed_out"] and text_of(r).startswith("killed after its timeout"),
          f"{how}: timeout {text_of(r)!r}")
    await err(s, "exec", {"shell": "pwd", "cwd": "../bob"}, "outside_desk", f"{how}: exec cwd escape")
    await err(s, "exec", {"shell": "pwd", "cwd": "out"}, "not_dir", f"{how}: exec cwd through a planted link")
    await err(s, "exec", {"shell": "true", "command": ["true"]}, "bad_request", f"{how}: exec both forms")
    await err(s, "exec", {"shell": "true", "env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "bad_request", f"{how}: exec credential env")
    await err(s, "journal", {"limit": 0}, "bad_request", f"{how}: journal limit 0")
    await err(s, "journal", {"task": "nope-task"}, "not_found", f"{how}: journal of no task")


async def read_only(s, how):
    r = await ok(s, "read_text_file", {"path": "notes/mcp.txt"}, f"{how}: read")
    for tool, args in [("write_file", {"path": "notes/ro.txt", "content": "x"}),
                       ("edit_file", {"path": "notes/mcp.txt", "edits": [{"oldText": "a", "newText": "A"}]}),
                       ("create_directory", {"path": "rodir"}),
                       ("move_file", {"source": "notes/mcp.txt", "destination": "notes/m"}),
                       ("task_start", {"task": "ro", "repo": "app"}),
                       ("exec", {"shell": "touch /desk/notes/ro-exec"})]:
        await err(s, tool, args, "read_only_token", f"{how}: {tool}")
    check(not os.path.exists(os.path.join(DESK, "notes/ro.txt")), f"{how}: nothing written")
    check(not os.path.exists(os.path.join(DESK, "notes/ro-exec")), f"{how}: nothing run")
    await ok(s, "journal", {"limit": 1}, f"{how}: journal (a read)")
    # a dry run changes nothing, so a read-only session may preview an edit
    await ok(s, "edit_file", {"path": "notes/mcp.txt", "dryRun": True,
                              "edits": [{"oldText": "a", "newText": "A"}]}, f"{how}: dry run")


async def stdio(read_only_flag=False):
    args = ["--root", ROOT, "mcp", "alice"] + (["--read-only"] if read_only_flag else [])
    params = StdioServerParameters(command=DESKFS, args=args, env=dict(os.environ))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        init = await s.initialize()
        check(init.server_info.name == "deskfs", f"server name: {init.server_info}")
        if read_only_flag:
            await read_only(s, "stdio --read-only")
        else:
            await tool_list(s)
            await file_tools(s)
            await confinement(s)
            await desk_tools(s)
            await exec_tools(s, "stdio")


async def http(token, body):
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(f"{BASE}/mcp", http_client=client) as (r, w), \
            ClientSession(r, w) as s:
        await s.initialize()
        await body(s)


async def http_rw(s):
    await tool_list(s)
    r = await ok(s, "write_file", {"path": "notes/http.txt", "content": "over http\n"})
    with open(os.path.join(DESK, "notes/http.txt")) as f:
        check(f.read() == "over http\n", "http write_file content")
    r = await ok(s, "read_text_file", {"path": "/desk/notes/http.txt"})
    check(text_of(r) == "over http\n", f"http read: {text_of(r)!r}")
    await err(s, "read_text_file", {"path": "/etc/passwd"}, "outside_desk", "http escape")
    await exec_tools(s, "http")


def raw_post(token):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
    req = urllib.request.Request(f"{BASE}/mcp", data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


async def main():
    await stdio()
    await stdio(read_only_flag=True)
    await http(TOKENS["rw"], http_rw)
    await http(TOKENS["ro"], lambda s: read_only(s, "http read-only token"))
    for what, tok, code in [("no token", None, "unauthorized"), ("unknown token", "dsk_alice_bogus", "unauthorized"),
                            ("revoked token", TOKENS["revoked"], "token_revoked")]:
        status, headers, body = raw_post(tok)
        check(status == 401, f"/mcp with {what}: status {status} {body[:200]}")
        check(headers.get("www-authenticate", headers.get("WWW-Authenticate", "")).lower().startswith("bearer"),
              f"/mcp with {what}: WWW-Authenticate {headers}")
        check(json.loads(body)["error"]["code"] == code, f"/mcp with {what}: {body}")
    status, _, body = raw_post(TOKENS["rw"])
    check(status == 200, f"/mcp initialize with a token: {status} {body[:200]}")
    print(f"mcp: {CHECKS} checks passed")


asyncio.run(main())
