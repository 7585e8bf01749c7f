# tests/lib.sh — helpers sourced by every tests/e2e/*.sh script.
#
#   source "$(dirname "$0")/../lib.sh"
#
# What sourcing it gives a test:
#   * strict mode (set -Eeuo pipefail) and an ERR trap that turns any unexpected failing
#     command into "FAIL: <test>: command failed ... at file:line"
#   * $T: a fresh temp dir (removed at exit unless DESKFS_TEST_KEEP=1), a fresh
#     DESKFS_HOME=$T/home, mountpoints $T/mnt, $T/mnt2 (created on demand)
#   * $DESKFS: the binary under test (DESKFS_BIN, default target/release/deskfs)
#   * dfs / dfs_ok / ws_format / ws_mount / ws_mount_fg / ws_umount / force_unmount:
#     deskfs commands with timeouts; every mount and background PID is recorded and
#     cleaned up by the EXIT trap (deskfs umount --no-wait, fusermount3 -u, FUSE
#     connection abort, lazy unmount as the last resort; only recorded PIDs are killed)
#   * S3: need_s3, s3_url, s3_key, s3_get/s3_cat/s3_exists/s3_keys (exact keys, python
#     stdlib SigV4 client tests/s3.py), rc (rclone with an env-only "e2es3:" remote)
#   * the store of the test's workspaces, one interface for S3, Azure and GCS
#     (tests/store.sh, sourced here): need_store, store_url, store_key, store_keys,
#     store_exists, store_get, store_cat, store_put, store_put_dir, store_put_tree,
#     store_ctl, store_port_open, store_obj_eq
#   * PostgreSQL: need_pg, pg_fresh_db NAME (an empty database for this test, dropped at
#     exit; prints its URL), pg_admin_psql ARGS... (superuser psql), pg_ctl_server
#   * workspace metadata engine (DESKFS_E2E_META below): meta_is_pg, pg_meta_url NAME,
#     pg_url_nopw URL, pg_export_password, ws_meta_url NAME, ws_meta_snapshot NAME DIR,
#     ws_meta_psql NAME ARGS...
#   * fail, skip, log, assert_eq, assert_file_eq, wait_for, sha
#   * multi-host tests: source tests/hosts.sh after this file (network namespaces)
#
# Environment knobs (all optional; scripts/test.sh sets the S3 ones):
#   DESKFS_BIN               deskfs binary (default $ROOT/target/release/deskfs)
#   DESKFS_TEST_TMPDIR       where $T is created (default $TMPDIR or /tmp)
#   DESKFS_TEST_KEEP=1       keep $T (and the workspace) after the test
#   DESKFS_TEST_STRICT=1     missing S3 server / tools = FAIL instead of SKIP
#   DESKFS_TEST_RUN_DIR      run dir of scripts/test.sh: mounts/PIDs are also recorded there
#   BENCH_S3_* / AWS_*       the S3 server (output of scripts/s3-server.sh env); if absent
#                            but BENCH_STATE is set, $BENCH_STATE/s3/env.sh is loaded
#   DESKFS_TEST_S3_OWNED=1   the server may be stopped/started by tests (55-s3-outage);
#                            only scripts/test.sh sets it, for the server it started itself
#   DESKFS_TEST_PG_URL       postgres://deskfs:PW@127.0.0.1:PORT/deskfs_test (output of
#                            scripts/pg-server.sh env, with DESKFS_TEST_PG_ADMIN, PG_STATE,
#                            PG*); if absent but PG_STATE is set, $PG_STATE/env.sh is loaded
#   DESKFS_TEST_PG_OWNED=1   the PostgreSQL server may be stopped/started by tests
#                            (pg_ctl_server); only scripts/test.sh sets it
#   DESKFS_E2E_META          metadata engine of the workspaces ws_format creates: sqlite
#                            (default: deskfs's own default, meta.db in the workspace dir) or
#                            postgres: ws_format NAME adds --meta postgres://USER@HOST:PORT/DB
#                            ?schema=S, a fresh database of the test server (pg_fresh_db,
#                            dropped at exit), no password in the URL (deskfs reads
#                            PGPASSWORD, exported from DESKFS_TEST_PG_URL when unset);
#                            sourcing lib.sh then runs need_pg. The bucket stays whatever
#                            the test asks for (the local bucket dir by default).
#                            tests/e2e/8Np-*-pg.sh run the SQLite tests this way.
#   DESKFS_E2E_STORE         the store of the tests that use store_* (tests/store.sh): s3
#                            (default), azure or gcs: a private Azurite / fake-gcs-server
#                            started for the test when lib.sh is sourced. Set (any of the
#                            three): ws_format NAME with no --bucket puts the workspace on
#                            it (store_url NAME), so local-bucket tests run there too.
#                            tests/e2e/NNz-*-azure.sh and NNg-*-gcs.sh run the core tests so.
#   DESKFS_E2E_PG_SCHEMA     schema in those URLs (default deskfs_e2e; empty: no ?schema=,
#                            the database's default schema)
#   DESKFS_E2E_NAME          the test's name (default: the script's file name), for thin
#                            wrappers that exec another test script; read once, unset
# shellcheck shell=bash

set -Eeuo pipefail

LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$LIB_DIR/.." && pwd)
TEST_NAME=${DESKFS_E2E_NAME:-$(basename "$0" .sh)}
unset DESKFS_E2E_NAME   # a test this one starts has its own name
DESKFS=${DESKFS_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/deskfs}
SHARED_DIR=${DESKFS_SHARED_DIR:-$(cd "$ROOT/.." && pwd)/shared}
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

_tmpbase=${DESKFS_TEST_TMPDIR:-${TMPDIR:-/tmp}}
mkdir -p "$_tmpbase"
T=$(mktemp -d "$_tmpbase/deskfs-e2e.$TEST_NAME.XXXXXX")
T=$(realpath "$T")
export DESKFS_HOME=$T/home
mkdir -p "$DESKFS_HOME"
MNT=$T/mnt
MNT2=$T/mnt2

# Git must not read the machine's or the user's config; commits need an identity.
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=$T/gitconfig
cat > "$GIT_CONFIG_GLOBAL" <<'EOF'
[user]
	name = deskfs e2e
	email = e2e@deskfs.invalid
[init]
	defaultBranch = main
[safe]
	directory = *
[advice]
	detachedHead = false
EOF

_LIB_CLEANUPS=()   # extra commands run first at exit (e.g. restart the S3 server)

# ---------------------------------------------------------------- messages, asserts

log() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "$TEST_NAME" "$*" >&2; }

# fail MESSAGE: the test fails with this message (and exit status 1).
fail() {
  trap - ERR
  printf 'FAIL: %s: %s\n' "$TEST_NAME" "$*" >&2
  exit 1
}

# skip MESSAGE: the test is skipped (exit status 77).
skip() {
  trap - ERR
  printf 'SKIP: %s: %s\n' "$TEST_NAME" "$*" >&2
  exit 77
}

# In strict mode (scripts/test.sh) a missing prerequisite is a failure, not a skip.
skip_or_fail() {
  if [[ ${DESKFS_TEST_STRICT:-0} == 1 ]]; then fail "$*"; else skip "$*"; fi
}

_lib_on_err() {
  local rc=$1 line=$2 src=$3 cmd=$4
  # Only the test's main shell reports and exits: a failing ( ... ) subshell exits by
  # itself (set -e) and is then reported here with its command line; inside $(...) and
  # <(...) bash's usual rules apply.
  ((BASH_SUBSHELL == 0)) || return 0
  trap - ERR
  printf 'FAIL: %s: command failed (exit %s) at %s:%s: %s\n' "$TEST_NAME" "$rc" "$src" "$line" "$cmd" >&2
  exit 1
}
trap '_lib_on_err $? $LINENO "${BASH_SOURCE[0]##*/}" "$BASH_COMMAND"' ERR

_short() { local s=$1; ((${#s} > 300)) && s="${s:0:300}...(${#1} chars)"; printf '%s' "$s"; }

# assert_eq EXPECTED ACTUAL WHAT
assert_eq() {
  [[ "$1" == "$2" ]] || fail "$3: expected '$(_short "$1")', got '$(_short "$2")'"
}

# assert_file_eq FILE_A FILE_B WHAT: byte-identical (compared by sha256)
assert_file_eq() {
  [[ -f $1 ]] || fail "$3: $1 is missing or not a regular file"
  [[ -f $2 ]] || fail "$3: $2 is missing or not a regular file"
  local a b
  a=$(sha "$1") b=$(sha "$2")
  [[ $a == "$b" ]] || fail "$3: content differs ($1: $(stat -c %s "$1") bytes sha256 ${a:0:12}, $2: $(stat -c %s "$2") bytes sha256 ${b:0:12})"
}

# sha FILE (or stdin when no file): sha256 hex
sha() { if (($#)); then sha256sum < "$1" | cut -d' ' -f1; else sha256sum | cut -d' ' -f1; fi; }

# wait_for SECONDS CMD [ARGS...]: poll CMD every 0.2 s until it succeeds; 1 on timeout.
wait_for() {
  local secs=$1; shift
  local end=$((SECONDS + secs))
  while :; do
    "$@" && return 0
    ((SECONDS >= end)) && return 1
    sleep 0.2
  done
}

need_cmd() {
  local c
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || skip_or_fail "'$c' is not installed"; done
}

need_deskfs() {
  [[ -x $DESKFS ]] || fail "deskfs binary not found at $DESKFS (build it: cargo build --release -p deskfs)"
  need_cmd fusermount3 python3
  [[ -e /dev/fuse ]] || skip_or_fail "/dev/fuse is missing (no FUSE in this machine/container)"
}

# on_exit 'COMMAND STRING': run at exit, before mounts are cleaned up.
on_exit() { _LIB_CLEANUPS+=("$1"); }

# lossfs_start: the power-loss file system (crates/lossfs) over $T/disk at $T/lfs, its
# control socket $T/lossfs.sock; sets LOSSFS (the binary) and LFS. `lossfs_ctl ARGS`
# sends a command (cut, sync, fail-fsync PATTERN N, ...).
lossfs_start() {
  LOSSFS=${DESKFS_LOSSFS_BIN:-$(dirname "$DESKFS")/deskfs-lossfs}
  [[ -x $LOSSFS ]] || fail "deskfs-lossfs not found at $LOSSFS (build it: cargo build --release -p deskfs-lossfs)"
  LFS=$T/lfs
  mkdir -p "$T/disk" "$LFS"
  register_mount "$LFS"
  setsid "$LOSSFS" serve --backing "$T/disk" --control "$T/lossfs.sock" "$LFS" > "$T/lossfs.log" 2>&1 < /dev/null &
  register_pid "$!"
  wait_for 10 is_mounted "$LFS" || fail "deskfs-lossfs did not mount: $(tail -n 5 "$T/lossfs.log")"
}
lossfs_ctl() { "$LOSSFS" ctl "$T/lossfs.sock" "$@"; }

# ---------------------------------------------------------------- process / mount registry

_proc_start() { # start time of a PID (to never signal a recycled PID)
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  set -- $s
  echo "${20}"
}

# register_pid PID: killed (TERM, then KILL) at exit if still running.
register_pid() {
  local st
  st=$(_proc_start "$1") || return 0
  echo "$1 $st" >> "$T/pids"
  [[ -n ${DESKFS_TEST_RUN_DIR:-} ]] && echo "$1 $st" >> "$DESKFS_TEST_RUN_DIR/pids"
  return 0
}

# pid_running PID: the process exists and is not a zombie
pid_running() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s:0:1} != Z ]]
}

_pid_is_ours() { # PID STARTTIME
  [[ "$(_proc_start "$1" 2>/dev/null)" == "$2" ]]
}

register_mount() {
  echo "$1" >> "$T/mounts"
  [[ -n ${DESKFS_TEST_RUN_DIR:-} ]] && echo "$1" >> "$DESKFS_TEST_RUN_DIR/mounts"
  return 0
}

# free_port [WHAT] [N]: prints a TCP port P such that nobody listens on 127.0.0.1 at P
# .. P+N-1 (N defaults to 1), or fails naming WHAT. Picked below the kernel's ephemeral
# range (net.ipv4.ip_local_port_range, 32768 by default), so that no client socket can
# take it between this check and the bind.
free_port() {
  local p lo=32768 span n=${2:-1} i busy
  read -r lo _ < /proc/sys/net/ipv4/ip_local_port_range 2> /dev/null || lo=32768
  span=$((lo - 20000 - n))
  ((span >= 1000)) || span=20000
  for _ in $(seq 1 50); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % span))
    busy=0
    for ((i = 0; i < n; i++)); do
      if (exec 3<> "/dev/tcp/127.0.0.1/$((p + i))") 2> /dev/null; then busy=1; break; fi
    done
    if ((!busy)); then
      echo "$p"
      return 0
    fi
  done
  fail "no free port${1:+ for $1}"
}

# is_mounted DIR: DIR is a mount point right now (per /proc/self/mountinfo; works for
# dead FUSE mounts too, where stat fails with ENOTCONN).
is_mounted() {
  local p
  p=$(realpath -m "$1")
  awk -v p="$p" '$5 == p { f = 1 } END { exit !f }' /proc/self/mountinfo
}

not_mounted() { ! is_mounted "$1"; }

mount_count() { # how many mounts are stacked on DIR
  local p
  p=$(realpath -m "$1")
  awk -v p="$p" '$5 == p { n++ } END { print n + 0 }' /proc/self/mountinfo
}

# is_alive DIR: mounted and answering (stat within 5 s)
# run_shared_case OUT CASE ARGS...: runs a ../shared/cases script (120 s at most, output
# to OUT) and sets CASE_RESULT to PASS, "SKIP: …" or "FAIL: …" from its exit code and
# its last PASS/FAIL/SKIP line (70-cases, 89-hosts-cases, bench/juicefs-cases.sh).
# shellcheck disable=SC2034  # CASE_RESULT is read by the callers
run_shared_case() {
  local out=$1 c=$2 crc=0 last
  shift 2
  timeout -k 10 120 bash "$c" "$@" > "$out" 2>&1 < /dev/null || crc=$?
  last=$(grep -E '^(PASS|FAIL|SKIP)' "$out" | tail -n 1)
  case "$crc:$last" in
    0:PASS*) CASE_RESULT=PASS ;;
    77:SKIP*) CASE_RESULT=$last ;;
    124:* | 137:*) CASE_RESULT="FAIL: no result within 120 s${last:+ ($last)}" ;;
    *:FAIL*) CASE_RESULT=$last ;;
    *) CASE_RESULT="FAIL: exit $crc, last line: $(tail -n 1 "$out")" ;;
  esac
}

is_alive() { is_mounted "$1" && timeout -k 1 5 stat "$1" >/dev/null 2>&1; }

_abort_fuse_conn() { # abort the kernel FUSE connection of a (hung/dead) mount we made
  local p dev
  p=$(realpath -m "$1")
  dev=$(awk -v p="$p" '$5 == p { split($3, a, ":"); d = a[2] } END { print d }' /proc/self/mountinfo)
  if [[ -n $dev && -w /sys/fs/fuse/connections/$dev/abort ]]; then
    log "aborting FUSE connection $dev of $p"
    echo 1 > "/sys/fs/fuse/connections/$dev/abort" 2>/dev/null || true
  fi
}

# force_unmount DIR: fusermount3 -u, umount, abort the FUSE connection, then lazy unmount
# as the last resort. Returns 0 once DIR is no longer a mount point.
force_unmount() {
  local p=$1
  is_mounted "$p" || return 0
  timeout -k 2 15 fusermount3 -u "$p" >/dev/null 2>&1 || true
  is_mounted "$p" || return 0
  timeout -k 2 15 umount "$p" >/dev/null 2>&1 || true
  is_mounted "$p" || return 0
  _abort_fuse_conn "$p"
  timeout -k 2 15 fusermount3 -u "$p" >/dev/null 2>&1 || true
  is_mounted "$p" || return 0
  log "lazy unmount of $p (last resort)"
  fusermount3 -uz "$p" >/dev/null 2>&1 || umount -l "$p" >/dev/null 2>&1 || true
  ! is_mounted "$p"
}

# unmount_registered: unmount every registered mount that is still mounted (deskfs umount
# --no-wait, then force_unmount), newest first. For exit hooks that must run after the
# mounts are gone (dropping databases, removing network namespaces); _lib_cleanup does the
# same for whatever is left.
unmount_registered() {
  local m
  [[ -f $T/mounts ]] || return 0
  for m in $(tac "$T/mounts" | awk '!seen[$0]++'); do
    is_mounted "$m" || continue
    log "cleanup: $m is still mounted, unmounting"
    timeout -k 2 20 "$DESKFS" umount --no-wait "$m" > /dev/null 2>&1 < /dev/null
    force_unmount "$m" || log "cleanup: could not unmount $m"
  done
  return 0
}

_lib_cleanup() {
  local rc=$?
  set +e
  trap - ERR
  local c m pid st
  for c in "${_LIB_CLEANUPS[@]}"; do eval "$c"; done
  if [[ -f $T/mounts ]]; then
    for m in $(tac "$T/mounts" | awk '!seen[$0]++'); do
      is_mounted "$m" || continue
      log "cleanup: $m is still mounted, unmounting"
      timeout -k 2 20 "$DESKFS" umount --no-wait "$m" >/dev/null 2>&1
      force_unmount "$m" || log "cleanup: could not unmount $m"
    done
  fi
  if [[ -f $T/pids ]]; then
    while read -r pid st; do
      _pid_is_ours "$pid" "$st" || continue
      kill -TERM "$pid" 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do _pid_is_ours "$pid" "$st" || break; sleep 0.3; done
      _pid_is_ours "$pid" "$st" && kill -KILL "$pid" 2>/dev/null
    done < "$T/pids"
  fi
  if ((rc != 0 && rc != 77)); then
    # help the reader: the logs deskfs and the test left behind
    local f
    while IFS= read -r f; do
      [[ -s $f ]] || continue
      echo "----- last lines of $f" >&2
      tail -n 40 "$f" >&2
    done < <(find "$T" -xdev -maxdepth 6 -name '*.log' -type f 2>/dev/null | sort)
  fi
  if [[ ${DESKFS_TEST_KEEP:-0} == 1 ]]; then
    log "keeping $T (DESKFS_TEST_KEEP=1)"
  elif awk -v p="$T/" 'index($5, p) == 1 { f = 1 } END { exit !f }' /proc/self/mountinfo; then
    log "something is still mounted under $T: not deleting it"
  else
    rm -rf --one-file-system "$T" 2>/dev/null
  fi
  exit "$rc"
}
trap _lib_cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# ---------------------------------------------------------------- deskfs commands

# dfs ARGS...: run deskfs with a timeout (DFS_TIMEOUT, default 120 s), stdin closed.
dfs() { timeout -k 5 "${DFS_TIMEOUT:-120}" "$DESKFS" "$@" < /dev/null; }

# dfs_ok ARGS...: run deskfs; on non-zero exit fail with its output.
dfs_ok() {
  local out rc=0
  out=$(dfs "$@" 2>&1) || rc=$?
  ((rc == 0)) || fail "deskfs $* failed (exit $rc$( ((rc == 124)) && echo ", timed out after ${DFS_TIMEOUT:-120}s")): $out"
  [[ -n $out ]] && printf '%s\n' "$out" >&2
  return 0
}

# ws_format NAME [ARGS...]: deskfs format NAME ARGS..., must succeed. With
# DESKFS_E2E_META=postgres and no --meta in ARGS: also --meta "$(pg_meta_url NAME)".
# With DESKFS_E2E_STORE set and no --bucket in ARGS: also --bucket "$(store_url NAME)".
ws_format() {
  if [[ -n ${DESKFS_E2E_STORE:-} ]] && ! _has_arg --bucket "$@"; then
    need_store
    set -- "$@" --bucket "$(store_url "${1:-ws}")"
  fi
  if meta_is_pg && ! _has_meta_arg "$@"; then
    local murl
    pg_export_password
    murl=$(pg_meta_url "${1:-ws}") || fail "ws_format: no PostgreSQL database for the workspace"
    set -- "$@" --meta "$murl"
  fi
  log "deskfs format $*"
  dfs_ok format "$@"
}
_has_meta_arg() { _has_arg --meta "$@"; }
_has_arg() { # FLAG ARGS...: ARGS hold FLAG or FLAG=…
  local f=$1 a
  shift
  for a in "$@"; do [[ $a == "$f" || $a == "$f="* ]] && return 0; done
  return 1
}

_mount_seq=0
# ws_mount NAME DIR [ARGS...]: deskfs mount (daemonizing); must return with DIR mounted and
# answering. The command's output goes to a file, never to a pipe: a daemon that keeps
# its inherited stdout would otherwise hang the caller.
ws_mount() {
  local name=$1 dir=$2; shift 2
  mkdir -p "$dir"
  register_mount "$dir"
  _mount_seq=$((_mount_seq + 1))
  local out=$T/mount-cmd.$_mount_seq.out rc=0
  log "deskfs mount $name $dir $*"
  timeout -k 5 "${DESKFS_MOUNT_TIMEOUT:-60}" "$DESKFS" mount "$name" "$dir" "$@" > "$out" 2>&1 < /dev/null || rc=$?
  ((rc == 0)) || fail "deskfs mount $name $dir $* failed (exit $rc$( ((rc == 124)) && echo ", timed out")): $(head -c 2000 "$out")"
  # "returns once mounted": allow a moment for the mount table, nothing more
  wait_for 5 is_mounted "$dir" || fail "deskfs mount $name $dir returned 0 but $dir is not mounted"
  is_alive "$dir" || fail "$dir is mounted but does not answer stat within 5 s"
}

# ws_mount_fg NAME DIR [ARGS...]: deskfs mount --foreground in the background; sets FG_PID
# (the daemon itself) and waits until DIR is mounted. Output: $T/mount-fg.N.log
FG_PID=
ws_mount_fg() {
  local name=$1 dir=$2; shift 2
  mkdir -p "$dir"
  register_mount "$dir"
  _mount_seq=$((_mount_seq + 1))
  local out=$T/mount-fg.$_mount_seq.log
  log "deskfs mount $name $dir --foreground $* (log $out)"
  setsid "$DESKFS" mount "$name" "$dir" --foreground "$@" > "$out" 2>&1 < /dev/null &
  FG_PID=$!
  register_pid "$FG_PID"
  local end=$((SECONDS + ${DESKFS_MOUNT_TIMEOUT:-60}))
  until is_mounted "$dir"; do
    pid_running "$FG_PID" || fail "deskfs mount --foreground exited before mounting: $(tail -n 20 "$out")"
    ((SECONDS < end)) || fail "$dir not mounted ${DESKFS_MOUNT_TIMEOUT:-60}s after deskfs mount --foreground"
    sleep 0.05
  done
  is_alive "$dir" || fail "$dir is mounted but does not answer stat within 5 s"
}

# ws_umount DIR [ARGS...]: deskfs umount (flushes, waits for uploads); DIR must be unmounted.
# Waits for uploads up to DESKFS_UMOUNT_TIMEOUT - 30 s (umount's own --timeout, unless ARGS
# set it or --no-wait): a test's big uploads may take longer than umount's 60 s default.
ws_umount() {
  local dir=$1; shift
  local a wait=(--timeout $((${DESKFS_UMOUNT_TIMEOUT:-300} - 30)))
  for a in "$@"; do [[ $a == --timeout* || $a == --no-wait ]] && wait=(); done
  set -- "${wait[@]}" "$@"
  log "deskfs umount $dir $*"
  DFS_TIMEOUT=${DESKFS_UMOUNT_TIMEOUT:-300} dfs_ok umount "$dir" "$@"
  wait_for 10 not_mounted "$dir" || fail "deskfs umount $dir returned 0 but $dir is still mounted"
}

# ws_sync NAME: deskfs sync (must succeed within DESKFS_SYNC_TIMEOUT, default 300 s)
ws_sync() {
  log "deskfs sync $1"
  DFS_TIMEOUT=${DESKFS_SYNC_TIMEOUT:-300} dfs_ok sync "$1"
}

# ---------------------------------------------------------------- S3

if [[ -z ${BENCH_S3_ENDPOINT:-} && -n ${BENCH_STATE:-} && -f $BENCH_STATE/s3/env.sh ]]; then
  # shellcheck disable=SC1091
  source "$BENCH_STATE/s3/env.sh"
fi
S3_BUCKET=${BENCH_S3_BUCKET:-}
# a prefix no other test or run uses
S3_PREFIX="e2e-$TEST_NAME-$(date +%Y%m%d%H%M%S)-$$-$RANDOM"

s3_port_open() {
  local hp=${BENCH_S3_ENDPOINT#*://}
  hp=${hp%%/*}
  (exec 3<> "/dev/tcp/${hp%%:*}/${hp##*:}") 2>/dev/null
}

have_s3() { [[ -n ${BENCH_S3_ENDPOINT:-} && -n ${BENCH_S3_ACCESS_KEY:-} && -n $S3_BUCKET ]] && s3_port_open; }

need_s3() {
  have_s3 || skip_or_fail "no S3 server (run through scripts/test.sh, or export the output of scripts/s3-server.sh env)"
  need_cmd rclone python3
}

# s3_url [SUBPREFIX]: the workspace URL for this test's prefix
s3_url() { echo "s3://$S3_BUCKET/$S3_PREFIX${1:+/$1}"; }
# s3_args: explicit connection flags for deskfs format
s3_args() {
  printf '%s\n' --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION" \
    --access-key "$BENCH_S3_ACCESS_KEY" --secret-key "$BENCH_S3_SECRET_KEY"
}
# s3_key PATH: the object key of workspace path PATH
s3_key() { echo "$S3_PREFIX/$1"; }

s3py() { timeout -k 5 300 python3 "$LIB_DIR/s3.py" "$@"; }

# s3_keys [PREFIX]: "<size>\t<key>" of every object under PREFIX (default: this test's prefix/)
s3_keys() { s3py ls "${1:-$S3_PREFIX/}"; }
# s3_exists KEY: exact key present
s3_exists() { s3py head "$1" > /dev/null 2>&1; }
# s3_get KEY > FILE: exact key's body (fails if missing)
s3_get() { s3py get "$1"; }

# rclone with an env-only remote "e2es3:" for the test server (no config file touched).
# AWS_CA_BUNDLE is dropped: rclone refuses a CA bundle on a plain-http endpoint.
rc() {
  : > "$T/rclone.conf"
  env -u AWS_CA_BUNDLE RCLONE_CONFIG="$T/rclone.conf" \
    RCLONE_CONFIG_E2ES3_TYPE=s3 RCLONE_CONFIG_E2ES3_PROVIDER=Other RCLONE_CONFIG_E2ES3_ENV_AUTH=false \
    RCLONE_CONFIG_E2ES3_ACCESS_KEY_ID="$BENCH_S3_ACCESS_KEY" \
    RCLONE_CONFIG_E2ES3_SECRET_ACCESS_KEY="$BENCH_S3_SECRET_KEY" \
    RCLONE_CONFIG_E2ES3_ENDPOINT="$BENCH_S3_ENDPOINT" RCLONE_CONFIG_E2ES3_REGION="$BENCH_S3_REGION" \
    RCLONE_CONFIG_E2ES3_FORCE_PATH_STYLE=true RCLONE_CONFIG_E2ES3_NO_CHECK_BUCKET=true \
    timeout -k 5 600 rclone "$@"
}
# rc_path KEY: "e2es3:bucket/KEY"
rc_path() { echo "e2es3:$S3_BUCKET/$1"; }

# s3_cat PATH: content of workspace PATH's object, read with `rclone cat`. rclone cat of a
# missing key prints nothing and exits 0, so the exact key is checked first.
s3_cat() {
  s3_exists "$(s3_key "$1")" || fail "object $(s3_key "$1") is not in the bucket"
  rc cat "$(rc_path "$(s3_key "$1")")"
}

# assert_obj_eq PATH LOCALFILE: object of workspace PATH (read with rclone cat) == LOCALFILE
assert_obj_eq() {
  local key got exp
  key=$(s3_key "$1")
  s3_exists "$key" || fail "object $key is not in the bucket"
  rc cat "$(rc_path "$key")" > "$T/obj.cat" || fail "rclone cat $key failed"
  got=$(sha "$T/obj.cat")
  exp=$(sha "$2")
  [[ $got == "$exp" ]] || fail "object $key content differs from $2 ($(stat -c %s "$T/obj.cat") bytes sha256 ${got:0:12} in the bucket, $(stat -c %s "$2") bytes sha256 ${exp:0:12} expected)"
}

# s3 server control (only for a server scripts/test.sh started: DESKFS_TEST_S3_OWNED=1)
s3_ctl() {
  [[ ${DESKFS_TEST_S3_OWNED:-0} == 1 && -n ${BENCH_STATE:-} ]] || fail "s3_ctl: not allowed (server not owned by this run)"
  bash "${DESKFS_TEST_S3_CTL:-$ROOT/scripts/s3-server.sh}" "$@"
}

# ---------------------------------------------------------------- PostgreSQL

if [[ -z ${DESKFS_TEST_PG_URL:-} && -n ${PG_STATE:-} && -f $PG_STATE/env.sh ]]; then
  # shellcheck disable=SC1091
  source "$PG_STATE/env.sh"
fi

# need_pg: skip (fail under DESKFS_TEST_STRICT=1) without DESKFS_TEST_PG_URL; fail if it is
# set but the server does not answer.
need_pg() {
  [[ -n ${DESKFS_TEST_PG_URL:-} ]] || skip_or_fail "no PostgreSQL (run through scripts/test.sh, or export the output of scripts/pg-server.sh env)"
  need_cmd psql
  local out
  out=$(PGCONNECT_TIMEOUT=5 psql -X -q -t -A "$DESKFS_TEST_PG_URL" -c 'SELECT 1' 2>&1) ||
    fail "PostgreSQL at ${DESKFS_TEST_PG_URL%%://*}://…@${DESKFS_TEST_PG_URL##*@} does not answer: ${out%%$'\n'*}"
}

# pg_admin_psql ARGS...: psql as the superuser (DESKFS_TEST_PG_ADMIN, a libpq conninfo;
# without it: as the DESKFS_TEST_PG_URL user), no psqlrc, stop on the first error.
pg_admin_psql() {
  PGCONNECT_TIMEOUT=10 timeout -k 5 120 psql -X -v ON_ERROR_STOP=1 "${DESKFS_TEST_PG_ADMIN:-$DESKFS_TEST_PG_URL}" "$@"
}

# pg_fresh_db NAME: creates an empty database owned by the URL's user (deskfs), named
# t_<NAME>_<pid>_<random> (unique per test and call), prints its URL (DESKFS_TEST_PG_URL
# with the database replaced). Dropped at exit (WITH (FORCE): open sessions are ended).
# Works inside $(...).
pg_fresh_db() {
  (($# == 1)) && [[ -n $1 ]] || fail "pg_fresh_db: expected one NAME"
  [[ -n ${DESKFS_TEST_PG_URL:-} ]] || fail "pg_fresh_db: DESKFS_TEST_PG_URL is not set (need_pg first)"
  local re='^(postgres(ql)?://([^:@/]+)(:[^@/]*)?@[^/]+)/[^?]*(\?.*)?$'
  [[ $DESKFS_TEST_PG_URL =~ $re ]] || fail "pg_fresh_db: cannot parse DESKFS_TEST_PG_URL (postgres://USER:PW@HOST:PORT/DB expected)"
  local base=${BASH_REMATCH[1]} owner=${BASH_REMATCH[3]} query=${BASH_REMATCH[5]}
  local name
  name=$(printf '%s' "$1" | tr -c 'a-zA-Z0-9_' '_' | tr 'A-Z' 'a-z')
  name="t_${name:0:40}_$$_${RANDOM}${RANDOM}"
  printf '%s\t%s\n' "$name" "${DESKFS_TEST_PG_ADMIN:-$DESKFS_TEST_PG_URL}" >> "$T/pg-dbs"   # the server it is on
  pg_admin_psql -q -c "CREATE DATABASE \"$name\" OWNER \"$owner\"" > /dev/null ||
    fail "pg_fresh_db: CREATE DATABASE $name failed"
  echo "$base/$name$query"
}

_pg_drop_fresh_dbs() {
  [[ -f $T/pg-dbs ]] || return 0
  local db admin
  unmount_registered   # daemons using the databases go first
  while IFS=$'\t' read -r db admin; do
    [[ -n $db ]] || continue
    DESKFS_TEST_PG_ADMIN=$admin pg_admin_psql -q -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" > /dev/null 2>&1 ||
      log "cleanup: DROP DATABASE $db failed"
  done < "$T/pg-dbs"
  rm -f "$T/pg-dbs"
}
on_exit _pg_drop_fresh_dbs

# pg_ctl_server start|stop|status: control the test PostgreSQL server (only one that
# scripts/test.sh started: DESKFS_TEST_PG_OWNED=1)
pg_ctl_server() {
  [[ ${DESKFS_TEST_PG_OWNED:-0} == 1 && -n ${PG_STATE:-} ]] || fail "pg_ctl_server: not allowed (server not owned by this run)"
  bash "${DESKFS_TEST_PG_CTL:-$ROOT/scripts/pg-server.sh}" "$@"
}

# ---------------------------------------------------------------- workspace metadata engine

case ${DESKFS_E2E_META:-sqlite} in
  sqlite | postgres) ;;
  *) fail "DESKFS_E2E_META must be sqlite or postgres, got '${DESKFS_E2E_META}'" ;;
esac

# meta_is_pg: this run puts the metadata of ws_format's workspaces in PostgreSQL
meta_is_pg() { [[ ${DESKFS_E2E_META:-sqlite} == postgres ]]; }

# pg_url_nopw URL: URL without the password (postgres://USER:PW@HOST/... -> USER@HOST/...)
pg_url_nopw() {
  local re='^(postgres(ql)?://)([^:@/]+):[^@/]*@(.*)$'
  if [[ $1 =~ $re ]]; then echo "${BASH_REMATCH[1]}${BASH_REMATCH[3]}@${BASH_REMATCH[4]}"; else echo "$1"; fi
}

# pg_export_password: deskfs reads the password from PGPASSWORD (never from the URL); set it
# from DESKFS_TEST_PG_URL when the environment has none (scripts/pg-server.sh exports it).
# Main shell only (an export inside $(...) is lost).
pg_export_password() {
  [[ -z ${PGPASSWORD:-} ]] || return 0
  local re='^postgres(ql)?://[^:@/]+:([^@/]*)@'
  [[ ${DESKFS_TEST_PG_URL:-} =~ $re ]] && export PGPASSWORD=${BASH_REMATCH[2]}
  return 0
}

# pg_meta_url NAME: a deskfs --meta URL for a new workspace: a fresh database of the test
# server (pg_fresh_db NAME, dropped at exit), schema DESKFS_E2E_PG_SCHEMA (default
# deskfs_e2e), no password. Works inside $(...). Hosts reach it through hosts_pg_url URL.
pg_meta_url() {
  need_pg
  pg_export_password
  local url schema=${DESKFS_E2E_PG_SCHEMA-deskfs_e2e}
  url=$(pg_fresh_db "$1") || return 1
  url=$(pg_url_nopw "$url")
  if [[ -n $schema ]]; then
    [[ $url == *\?* ]] && url="$url&schema=$schema" || url="$url?schema=$schema"
  fi
  echo "$url"
}

# ws_meta_url NAME: the metadata URL workspace NAME records (workspace.toml under
# $DESKFS_HOME): sqlite:///…/meta.db or postgres://…
ws_meta_url() {
  local cfg=$DESKFS_HOME/workspaces/$1/workspace.toml url
  [[ -f $cfg ]] || fail "ws_meta_url: no workspace $1 under $DESKFS_HOME"
  url=$(sed -n 's/^meta *= *"\(.*\)"$/\1/p' "$cfg" | head -n 1)
  echo "${url:-sqlite://$DESKFS_HOME/workspaces/$1/meta.db}"
}

# _pg_libpq_url URL: a deskfs postgres URL as libpq takes it (psql, pg_dump): without the
# ?schema= parameter (libpq does not know it); the schema goes to stdout's second line.
_pg_libpq_url() {
  local url=$1 q schema="" rest=() kv
  if [[ $url == *\?* ]]; then
    q=${url#*\?}
    url=${url%%\?*}
    IFS='&' read -r -a kv <<< "$q"
    for q in "${kv[@]}"; do
      case $q in schema=*) schema=${q#schema=} ;; ?*) rest+=("$q") ;; esac
    done
    ((${#rest[@]})) && url="$url?$(IFS='&'; echo "${rest[*]}")"
  fi
  printf '%s\n%s\n' "$url" "$schema"
}

# ws_meta_psql NAME ARGS...: psql on workspace NAME's PostgreSQL metadata (search_path set
# to its schema), no psqlrc, stop on the first error. Fails for a SQLite workspace.
ws_meta_psql() {
  local name=$1 url lurl schema
  shift
  url=$(ws_meta_url "$name")
  [[ $url == postgres://* || $url == postgresql://* ]] || fail "ws_meta_psql: workspace $name keeps its metadata in $url, not PostgreSQL"
  pg_export_password
  { read -r lurl; read -r schema; } < <(_pg_libpq_url "$url")
  PGOPTIONS="${schema:+-c search_path=$schema}" PGCONNECT_TIMEOUT=10 timeout -k 5 120 \
    psql -X -v ON_ERROR_STOP=1 "$lurl" "$@"
}

# ws_meta_snapshot NAME DIR: a copy of workspace NAME's metadata in DIR, for the reader of a
# failure: meta.db* (SQLite) or meta.sql, a pg_dump of its schema (PostgreSQL). Never fails
# the test (logs why it could not).
ws_meta_snapshot() {
  local name=$1 dir=$2 url lurl schema path
  mkdir -p "$dir"
  [[ -f $DESKFS_HOME/workspaces/$name/workspace.toml ]] || { log "ws_meta_snapshot: no workspace $name under $DESKFS_HOME"; return 0; }
  url=$(ws_meta_url "$name")
  case $url in
    postgres://* | postgresql://*)
      pg_export_password
      { read -r lurl; read -r schema; } < <(_pg_libpq_url "$url")
      PGCONNECT_TIMEOUT=10 timeout -k 5 120 pg_dump --no-owner ${schema:+-n "$schema"} -f "$dir/meta.sql" "$lurl" \
        > "$dir/pg_dump.err" 2>&1 || log "ws_meta_snapshot: pg_dump of $(pg_url_nopw "$url") failed: $(head -n 2 "$dir/pg_dump.err")"
      ;;
    *)
      path=${url#sqlite://}
      cp "$path"* "$dir/" 2> /dev/null || log "ws_meta_snapshot: could not copy $path*"
      ;;
  esac
  return 0
}

# with the switch on, every test that sources lib.sh needs the PostgreSQL server
if meta_is_pg; then
  need_pg
  pg_export_password
fi

# ---------------------------------------------------------------- the store (S3, Azure, GCS)

# shellcheck source=tests/store.sh
source "$LIB_DIR/store.sh"
# an emulator of the switch is started now (as need_pg above), in the test's main shell
[[ ${DESKFS_E2E_STORE:-s3} == s3 ]] || need_store

# ---------------------------------------------------------------- misc helpers

# assert_not_listed DIR NAME: readdir of DIR works and does not return NAME
assert_not_listed() {
  local r=0
  python3 -c 'import os, sys; sys.exit(3 if sys.argv[2] in os.listdir(sys.argv[1]) else 0)' "$1" "$2" 2> "$T/listdir.err" || r=$?
  case $r in
    0) ;;
    3) fail "$2 is listed by readdir of $1 (it must be hidden)" ;;
    *) fail "readdir of $1 failed: $(cat "$T/listdir.err")" ;;
  esac
}

# tree_manifest DIR: one line per entry below DIR, sorted, TAB-separated fields
#   type(f|d|l|?)  mode(octal)  size(files, else -)  sha256(files) | target(links) | -  relpath
# Used to compare a tree before/after unmount (mtimes are left out on purpose).
tree_manifest() {
  python3 - "$1" <<'PY'
import hashlib, os, stat, sys
root = sys.argv[1]
out = []
for dp, dns, fns in os.walk(root):
    for n in dns + fns:
        p = os.path.join(dp, n)
        rel = os.path.relpath(p, root)
        st = os.lstat(p)
        m = f"{stat.S_IMODE(st.st_mode):o}"
        if stat.S_ISLNK(st.st_mode):
            row = ("l", m, "-", os.readlink(p), rel)
        elif stat.S_ISDIR(st.st_mode):
            row = ("d", m, "-", "-", rel)
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for b in iter(lambda: f.read(1 << 20), b""):
                    h.update(b)
            row = ("f", m, str(st.st_size), h.hexdigest(), rel)
        else:
            row = ("?", m, "-", "-", rel)
        out.append("\t".join(row))
out.sort(key=lambda l: l.split("\t")[4])
print("\n".join(out))
PY
}

# assert_same_tree MANIFEST_FILE DIR WHAT
assert_same_tree() {
  tree_manifest "$2" > "$T/manifest.now"
  if ! diff -u "$1" "$T/manifest.now" > "$T/manifest.diff"; then
    fail "$3: tree differs (- before, + now):
$(head -n 40 "$T/manifest.diff")"
  fi
}
