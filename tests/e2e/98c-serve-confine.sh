#!/usr/bin/env bash
# 98c-serve-confine: the confinement suite of `deskfs serve` / `deskfs mcp` on a real FUSE
# mount (embedded default), desks alice and bob. tests/tools/confine_check.py plants what
# an agent could (symlinks in alice pointing out of the desk: directory and file links,
# absolute and relative, into bob, to the desk root, a link to a link, a /proc magic link;
# the same under memories/, and memories/ itself as a link) and canaries outside the desk
# (a host directory, a directory next to the desk root on the mount, desk bob), then
# drives every escape (`..` plain, percent-encoded and `a/../../x`; absolute paths;
# /memories prefix tricks; the planted links; NUL bytes; names over 255 and paths over
# 4,096 bytes) through every interface and operation: HTTP (GET, Range GET, stat, list,
# PUT, DELETE, mkdir, mkdir -p, move from/to, exec cwd, task and journal names), MCP over
# streamable HTTP and over stdio (every filesystem tool, exec's cwd when the tool exists,
# task tools, memory) and the memory tool over HTTP and MCP (every command). Each case is
# REFUSED (a stable error code / the memory tool's error string) or an ESCAPE (a canary's
# marker or /etc/passwd came back, or anything outside changed: content, inode, mtime,
# mode, a new entry). Also tokens: alice's on bob's desk, bob's on alice's, expired,
# revoked, forged, none — for every endpoint; a read-only token attempting every write
# (HTTP, MCP over HTTP, `deskfs mcp --read-only`); over /mcp a token revoked or expired
# during a session and a read-only token's request in a read-write session; and races:
# threads that keep swapping a directory for a link out while requests (HTTP, MCP, memory,
# exec) go through it — nothing outside is ever read or written. Writes into the desk's
# record `.desk/` are listed as pending until it is read-only to agents. Passes with
# "N cases, 0 escapes".
# e2e-cost: 35
# e2e-timeout: 400
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd git bwrap
MCP_PY=${DESKFS_TEST_PY:-python3}
"$MCP_PY" -c "import mcp" 2> /dev/null ||
  skip_or_fail "no MCP Python SDK at $MCP_PY (scripts/test.sh installs it into a venv; or pip install mcp)"

ws_format emb
ws_mount emb "$MNT"
root=$MNT/desks
dfs desk create alice > /dev/null || fail "desk create alice"
dfs desk create bob > /dev/null || fail "desk create bob"
git init -q -b main "$root/alice/repos/app"
git -C "$root/alice/repos/app" commit -q --allow-empty -m first
outside=$T/outside
mkdir -p "$outside"

rw=$(dfs token create alice 2> /dev/null) || fail "token create"
ro=$(dfs token create alice --read-only 2> /dev/null) || fail "token create --read-only"
bob=$(dfs token create bob 2> /dev/null) || fail "token create bob"
expired=$(dfs token create alice --expires 1s 2> /dev/null) || fail "token create --expires"
revoked=$(dfs token create alice 2> /dev/null) || fail "token create (to revoke)"
id=$(dfs token list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["id"])')
dfs token revoke "$id" > /dev/null || fail "token revoke $id"
sleep 1.1 # the expired token's second passes

"$DESKFS" serve --listen 127.0.0.1:0 > "$T/serve.out" 2> "$T/serve.err" < /dev/null &
pid=$!
register_pid "$pid"
wait_for 20 grep -q "http://" "$T/serve.out" || fail "serve did not start: $(cat "$T/serve.err")"
base=$(grep -o 'http://[0-9.:]*' "$T/serve.out")
log "serving at $base"

tokens=$(printf '{"rw":"%s","ro":"%s","bob":"%s","expired":"%s","revoked":"%s"}' "$rw" "$ro" "$bob" "$expired" "$revoked")
rc=0
timeout -k 10 360 "$MCP_PY" "$ROOT/tests/tools/confine_check.py" "$DESKFS" "$root" "$base" "$outside" "$tokens" \
  > "$T/confine.out" 2>&1 || rc=$?
# The matrix, the pending and known lists, notes and the last line; on a failure first
# every failing case (each with its exact request).
if ((rc != 0)); then
  grep -E '^(ESCAPE|UNEXPECTED|ODD|PENDING):' "$T/confine.out" | head -60 >&2 || true
  grep -A30 '^Traceback' "$T/confine.out" >&2 || true
fi
sed -n '/^confine_check matrix/,$p' "$T/confine.out" >&2
((rc == 0)) || fail "$(grep -E '^confine_check: [0-9]+ cases' "$T/confine.out" || echo "confine_check exited $rc")"
kill -TERM "$pid"
wait_for 10 bash -c "! kill -0 $pid 2> /dev/null" || fail "serve did not stop on SIGTERM"
ws_umount "$MNT"
log "$(grep -E '^confine_check: [0-9]+ cases' "$T/confine.out")"
log "PASS"
