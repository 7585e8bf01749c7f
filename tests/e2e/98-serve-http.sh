#!/usr/bin/env bash
# 98-serve-http: the desks' HTTP API (`deskfs serve`) on a real mount, embedded default and
# Garage. Desks alice and bob; tokens: alice read-write, alice read-only, bob, an expired
# and a revoked one of alice. tests/tools/serve_check.py then drives every endpoint (files
# with Range and If-Match/If-None-Match, stat, list, mkdir, move, delete), every token
# refusal, every escape (symlinks planted by the agent pointing out, encoded `..`, absolute
# paths, NUL, over-long names; for reads, writes, listings, mkdir, moves and deletes), tasks
# (start, list, resume, finish refused with uncommitted work, then discarded) and
# 240 concurrent requests (a file per writer read back, 40 If-Match increments of one
# counter: none lost), exec (output streamed before the command ends, proven by a file the
# check makes only after reading it; timeout and disconnect kill the whole tree; exit codes,
# signals, stderr apart; read-only, cwd and env refusals), the status endpoint, and the
# task journal (GET .../journal: an exec's entry is there when its exit arrives, with
# exactly the files it created, changed and deleted; timed-out and disconnected execs
# are recorded as killed; bad queries refused).
# tests/tools/mcp_check.py (the official MCP Python SDK) then drives
# the MCP tools over stdio (`deskfs mcp alice`, and `--read-only`) and over /mcp with the
# rw and ro tokens: every tool's result text, annotations and schemas, the same escapes,
# read-only refusals, the memory tool, exec (output, exit, timeout, cwd escapes) with its
# journal entry (via mcp, the files it changed) read back through the journal tool, and
# 401 + WWW-Authenticate for a missing, unknown or revoked token.
# Also: bad command lines and a port in use give one clear line.
# e2e-cost: 32
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd git curl bwrap
MCP_PY=${DESKFS_TEST_PY:-python3}
"$MCP_PY" -c "import mcp" 2> /dev/null ||
  skip_or_fail "no MCP Python SDK at $MCP_PY (scripts/test.sh installs it into a venv; or pip install mcp)"

check_serve() { # NAME MOUNTPOINT
  local name=$1 mnt=$2
  local root=$mnt/desks
  dfs desk create alice > /dev/null || fail "desk create alice"
  dfs desk create bob > /dev/null || fail "desk create bob"
  # An agent plants symlinks pointing out of its desk (as it could from `deskfs exec`).
  local outdir=$T/outside-$name
  mkdir -p "$outdir" && printf 'secret\n' > "$outdir/secret.txt"
  ln -s "$outdir" "$root/alice/out"
  ln -s "$outdir/secret.txt" "$root/alice/outfile"
  # A repo for the task endpoints.
  git init -q -b main "$root/alice/repos/app"
  git -C "$root/alice/repos/app" -c user.name=t -c user.email=t@x commit -q --allow-empty -m first
  local rw ro bob expired revoked id
  rw=$(dfs token create alice 2> /dev/null) || fail "token create"
  ro=$(dfs token create alice --read-only 2> /dev/null) || fail "token create --read-only"
  bob=$(dfs token create bob 2> /dev/null) || fail "token create bob"
  expired=$(dfs token create alice --expires 1s 2> /dev/null) || fail "token create --expires"
  revoked=$(dfs token create alice 2> /dev/null) || fail "token create (to revoke)"
  id=$(dfs token list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["id"])')
  dfs token revoke "$id" > /dev/null || fail "token revoke $id"
  grep -q "revoked" <<< "$(dfs token list)" || fail "token list does not show the revocation"
  [[ $(stat -c %a "$root/.deskfs-tokens.toml") == 600 ]] || fail "token store is not mode 0600"
  ! grep -q "$rw" "$root/.deskfs-tokens.toml" || fail "a token is stored in clear"
  sleep 1.1 # the expired token's second passes

  "$DESKFS" serve --listen 127.0.0.1:0 > "$T/serve-$name.out" 2> "$T/serve-$name.err" < /dev/null &
  local pid=$!
  register_pid "$pid"
  wait_for 20 grep -q "http://" "$T/serve-$name.out" || fail "serve did not start: $(cat "$T/serve-$name.err")"
  local base
  base=$(grep -o 'http://[0-9.:]*' "$T/serve-$name.out")
  log "$name: serving at $base"
  local tokens
  tokens=$(printf '{"rw":"%s","ro":"%s","bob":"%s","expired":"%s","revoked":"%s"}' "$rw" "$ro" "$bob" "$expired" "$revoked")
  python3 "$ROOT/tests/tools/serve_check.py" "$base" "$root" "$outdir/secret.txt" "$tokens" > "$T/check-$name.out" 2>&1 \
    || fail "$name: $(tail -3 "$T/check-$name.out")"
  log "$name: $(tail -1 "$T/check-$name.out")"
  # MCP through the official Python SDK: stdio (`deskfs mcp alice`) and /mcp with the
  # same tokens.
  MCP_CHECK_ON_MOUNT=1 "$MCP_PY" "$ROOT/tests/tools/mcp_check.py" "$DESKFS" "$root" "$base" \
    "$(printf '{"rw":"%s","ro":"%s","revoked":"%s"}' "$rw" "$ro" "$revoked")" > "$T/mcp-$name.out" 2>&1 \
    || fail "$name: $(grep -m1 '^FAIL' "$T/mcp-$name.out" || tail -3 "$T/mcp-$name.out")"
  log "$name: $(tail -1 "$T/mcp-$name.out")"

  # A desk removed and made again is another desk: the old desk's tokens do not open it.
  dfs desk rm bob --yes > /dev/null || fail "desk rm bob"
  dfs desk create bob > /dev/null || fail "desk create bob again"
  local got
  got=$(curl -s -H "Authorization: Bearer $bob" "$base/v1/desks/bob/stat")
  [[ $got == *'"code":"token_revoked"'* ]] || fail "an old desk's token opened the new desk: $got"
  got=$(curl -s -H "Authorization: Bearer $bob" "$base/v1/desks/nobody/stat")
  [[ $got == *'"code":"token_scope"'* ]] || fail "another desk: $got"

  # A second server on the same port: one clear line, non-zero exit.
  local port=${base##*:} out rc=0
  out=$(timeout 20 "$DESKFS" serve --listen "127.0.0.1:$port" 2>&1 < /dev/null) || rc=$?
  ((rc != 0)) || fail "a second serve on port $port did not fail"
  [[ $(wc -l <<< "$out") == 1 && $out == *"cannot listen on 127.0.0.1:$port"* ]] || fail "port in use said: $out"
  kill -TERM "$pid"
  wait_for 10 bash -c "! kill -0 $pid 2> /dev/null" || fail "serve did not stop on SIGTERM"
}

ws_format emb
ws_mount emb "$MNT"
check_serve emb "$MNT"

# Bad command lines: one line each, non-zero, nothing made.
expect_bad() { # WHAT EXPECTED-SUBSTRING CMD...
  local what=$1 want=$2 out rc=0
  shift 2
  out=$(timeout 20 "$DESKFS" "$@" 2>&1 < /dev/null) || rc=$?
  ((rc != 0)) || fail "$what: exit 0"
  [[ $(wc -l <<< "$out") == 1 && $out == *"$want"* ]] || fail "$what: said: $out"
}
expect_bad "bad --listen" "invalid --listen" serve --listen nonsense
expect_bad "bad --expires" "invalid lifetime" token create alice --expires 3y
expect_bad "token for a missing desk" "no desk for agent" token create nobody
expect_bad "revoke an unknown id" "no token with id" token revoke abcdef123
expect_bad "serve a missing root" "does not exist" serve --root "$MNT/none"
expect_bad "--max-commands 0" "not in 1..=1024" serve --max-commands 0
ws_umount "$MNT"

if have_s3; then
  MNT2=$T/mnt-s3
  mkdir -p "$MNT2"
  ws_format s3w --bucket "$(s3_url)" $(s3_args)
  ws_mount s3w "$MNT2"
  check_serve s3 "$MNT2"
  ws_umount "$MNT2"
else
  skip_or_fail "no S3 server for the Garage half (run through scripts/test.sh)"
fi
log "PASS"
