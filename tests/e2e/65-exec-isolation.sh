#!/usr/bin/env bash
# 65-exec-isolation: `deskfs exec` on a real deskfs mount keeps an agent inside its desk.
# Desks a and b are created on the mount (DESKFS_ROOT=$MNT/desks); from `deskfs exec a`:
#   * desk b cannot be read by its host path, by the mount's path, nor found anywhere in
#     the sandbox (a find over the whole tree for its uniquely named file); neither can the
#     workspace's meta.db, cache dir and workspace.toml (under $DESKFS_HOME), nor the mount
#     itself; the top level holds only the expected system dirs, /desk and /tmp;
#   * AWS_SECRET_ACCESS_KEY (and DESKFS_*) of the caller are in no process environment
#     inside;
#   * writing a file in /usr, /etc and / fails; writing /desk/notes/x works and the file appears
#     on the host at $MNT/desks/a/notes/x;
#   * exit code 7 and signal deaths (128+15) pass through, stdout and stderr separately;
#   * at a terminal (a pty): Ctrl-C reaches the command (its trap decides the exit code;
#     untrapped it ends with 130), TIOCSTI is refused (EPERM), /dev/tty works;
#   * with --net none an HTTP request to a python3 http.server on 127.0.0.1 (started by this
#     test) fails, without it the same request returns the served file.
# Skips (77) while `deskfs exec` is not part of the CLI.
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd bwrap python3 bash
"$DESKFS" exec --help > /dev/null 2>&1 ||
  skip "deskfs exec is not available in $DESKFS yet (deskfs exec --help failed)"

NAME=isows$RANDOM
WS=$DESKFS_HOME/workspaces/$NAME
ws_format "$NAME"
ws_mount "$NAME" "$MNT"
export DESKFS_ROOT=$MNT/desks
dfs_ok desk create a
dfs_ok desk create b
A=$DESKFS_ROOT/a
B=$DESKFS_ROOT/b
[[ -d $A/notes && -d $B/notes ]] || fail "desk create did not make notes/ under $DESKFS_ROOT/{a,b}"
SECRET_NAME=b-secret-$RANDOM$RANDOM.txt
echo "desk b secret" > "$B/notes/$SECRET_NAME"
for p in "$WS/meta.db" "$WS/workspace.toml" "$WS/cache"; do
  [[ -e $p ]] || fail "test setup: $p does not exist on the host"
done

# ex ARGS...: deskfs exec ARGS... with stdin closed; sets RC, OUT (stdout), ERR (stderr).
ex() {
  RC=0
  timeout -k 5 60 "$DESKFS" exec "$@" > "$T/ex.out" 2> "$T/ex.err" < /dev/null || RC=$?
  OUT=$(cat "$T/ex.out")
  ERR=$(cat "$T/ex.err")
}

# ---------------------------------------------------------------- it runs at all
ex a -- sh -c 'echo hello; pwd'
assert_eq 0 "$RC" "exit code of a plain command (stderr: $ERR)"
assert_eq $'hello\n/desk' "$OUT" "stdout of a plain command"

# ---------------------------------------------------------------- nothing else to read
log "reading desk b, the workspace's data and the mount from desk a"
PROBES=("$B" "$B/notes/$SECRET_NAME" "$DESKFS_ROOT" "$MNT" "$MNT/desks/b/notes/$SECRET_NAME"
  "/desk/../b/notes/$SECRET_NAME" "$WS/meta.db" "$WS/workspace.toml" "$WS/cache" "$DESKFS_HOME"
  "$WS/bucket")
# shellcheck disable=SC2016
ex a -- sh -c '
  n=0
  for p in "$@"; do
    n=$((n + 1))
    if ls -d "$p" > /dev/null 2>&1 || cat "$p" > /dev/null 2>&1; then echo "VISIBLE $p"; fi
  done
  echo "probed $n"' sh "${PROBES[@]}"
assert_eq 0 "$RC" "probe script (stderr: $ERR)"
assert_eq "probed ${#PROBES[@]}" "$OUT" "host paths visible inside exec"

# by any path: nothing anywhere in the sandbox carries those names (the local bucket
# holds desk b's file as an object of the same name)
ex a -- find / -path /proc -prune -o '(' -name "$SECRET_NAME" -o -name meta.db \
  -o -name workspace.toml -o -name "$NAME" ')' -print
assert_eq "" "$OUT" "files of desk b or of the workspace found inside exec"
# an empty result must not come from a find that never looked: /desk is found by path
ex a -- find / -path /proc -prune -o -name "notes" -print
[[ $OUT == *"/desk/notes"* ]] || fail "find inside exec does not see /desk/notes: $OUT $ERR"

ex a -- ls -A /
for name in $OUT; do
  case $name in
    usr | etc | opt | bin | sbin | lib | lib32 | lib64 | libx32 | proc | dev | tmp | desk | toolchain) ;;
    *) fail "unexpected top-level /$name inside exec (all: ${OUT//$'\n'/ })" ;;
  esac
done

# ---------------------------------------------------------------- credentials
log "caller credentials stay outside"
KEY=e2e-secret-$RANDOM$RANDOM
# shellcheck disable=SC2016
AWS_SECRET_ACCESS_KEY=$KEY AWS_ACCESS_KEY_ID=AKIAE2E ex a -- sh -c \
  'cat /proc/[0-9]*/environ | tr "\0" "\n"; echo; cat /proc/[0-9]*/cmdline | tr "\0" " "'
assert_eq 0 "$RC" "environment dump (stderr: $ERR)"
[[ $OUT == *HOME=/desk* ]] || fail "environment dump does not look like one: $OUT"
[[ $OUT != *"$KEY"* ]] || fail "AWS_SECRET_ACCESS_KEY's value is visible inside exec"
[[ $OUT != *AWS_* ]] || fail "AWS_* variables inside exec: $(grep AWS_ <<< "$OUT")"
[[ $OUT != *DESKFS_* ]] || fail "DESKFS_* variables inside exec: $(grep DESKFS_ <<< "$OUT")"

# ---------------------------------------------------------------- writes
log "writes outside /desk fail, inside /desk land on the desk"
# unique names, removed at exit should the sandbox ever let one through
OUTSIDE=("/usr/deskfs-e2e-x.$$" "/etc/deskfs-e2e-x.$$" "/deskfs-e2e-x.$$")
on_exit "rm -f ${OUTSIDE[*]}"
for p in "${OUTSIDE[@]}"; do
  ex a -- sh -c "echo x > $p"
  [[ $RC != 0 ]] || fail "writing $p inside exec succeeded"
  [[ ! -e $p ]] || fail "$p appeared on the host"
done
ex a -- sh -c 'echo from-exec > /desk/notes/x && cat /desk/notes/x'
assert_eq 0 "$RC" "writing /desk/notes/x (stderr: $ERR)"
assert_eq from-exec "$OUT" "reading back /desk/notes/x"
assert_eq from-exec "$(cat "$A/notes/x")" "$A/notes/x on the host"
[[ ! -e $B/notes/x ]] || fail "desk a's write landed on desk b"

# ---------------------------------------------------------------- exit codes, streams
ex a -- sh -c 'exit 7'
assert_eq 7 "$RC" "exit code passed through"
ex a -- sh -c 'kill -TERM $$'
assert_eq 143 "$RC" "signal death passed through as 128+15"
ex a -- sh -c 'echo to-out; echo to-err >&2; exit 3'
assert_eq 3 "$RC" "exit code with output"
assert_eq to-out "$OUT" "stdout passed through"
assert_eq to-err "$ERR" "stderr passed through"

# ---------------------------------------------------------------- at a terminal
# With a terminal, exec keeps the session (job control, /dev/tty) but TIOCSTI cannot type
# into it, and Ctrl-C is the command's: a command that traps it decides its exit code, one
# that does not dies of it (130).
log "at a terminal: Ctrl-C and TIOCSTI"
cat > "$T/at_terminal.py" <<'PY'
import os, pty, signal, sys
signal.alarm(30)
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
buf = b""
def read_until(token):
    global buf
    while token not in buf:
        d = os.read(fd, 1024)
        if not d:
            break
        buf += d
read_until(b"ready")
if os.environ.get("SEND_INTR"):
    os.write(fd, b"\x03")
try:
    while True:
        d = os.read(fd, 1024)
        if not d:
            break
        buf += d
except OSError:
    pass
_, status = os.waitpid(pid, 0)
sys.stdout.write(buf.decode(errors="replace").replace("\r", ""))
print("EXIT", os.waitstatus_to_exitcode(status))
PY
# shellcheck disable=SC2016
PTY_OUT=$(SEND_INTR=1 timeout -k 5 40 python3 "$T/at_terminal.py" "$DESKFS" exec a -- sh -c \
  'trap "echo got-INT; exit 42" INT; echo ready; sleep 20 & wait')
[[ $PTY_OUT == *got-INT* && $PTY_OUT == *"EXIT 42"* ]] ||
  fail "Ctrl-C at a terminal did not reach the command's handler: $PTY_OUT"
PTY_OUT=$(SEND_INTR=1 timeout -k 5 40 python3 "$T/at_terminal.py" "$DESKFS" exec a -- sh -c 'echo ready; exec sleep 20')
[[ $PTY_OUT == *"EXIT 130"* ]] || fail "Ctrl-C at a terminal did not end the command with 130: $PTY_OUT"
TIOCSTI='import errno, fcntl, termios
print("ready")
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
    print("TIOCSTI allowed")
except OSError as e:
    print("TIOCSTI", errno.errorcode[e.errno])
open("/dev/tty", "w").write("tty-ok\n")'
PTY_OUT=$(timeout -k 5 40 python3 "$T/at_terminal.py" "$DESKFS" exec a -- python3 -c "$TIOCSTI")
[[ $PTY_OUT == *"TIOCSTI EPERM"* ]] || fail "TIOCSTI at a terminal was not refused: $PTY_OUT"
[[ $PTY_OUT == *tty-ok* && $PTY_OUT == *"EXIT 0"* ]] || fail "/dev/tty unusable at a terminal: $PTY_OUT"

# ---------------------------------------------------------------- network
log "--net none"
mkdir -p "$T/www"
echo "served-$RANDOM" > "$T/www/probe.txt"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$T/www" "$PORT" > "$T/http.log" 2>&1 &
HTTP_PID=$!
register_pid "$HTTP_PID"
port_open() { (exec 3<> "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null; }
wait_for 10 port_open || fail "python3 http.server did not listen on 127.0.0.1:$PORT: $(cat "$T/http.log")"
# shellcheck disable=SC2016
GET='exec 3<> "/dev/tcp/127.0.0.1/$1" && printf "GET /probe.txt HTTP/1.0\r\n\r\n" >&3 && cat <&3'
ex a -- bash -c "$GET" bash "$PORT"
assert_eq 0 "$RC" "HTTP request to 127.0.0.1:$PORT with the host network (stderr: $ERR)"
[[ $OUT == *"$(cat "$T/www/probe.txt")"* ]] || fail "HTTP response lacks the served file: $OUT"
ex a --net none -- bash -c "$GET" bash "$PORT"
[[ $RC != 0 ]] || fail "HTTP request to 127.0.0.1:$PORT succeeded with --net none: $OUT"
[[ $OUT != *served-* ]] || fail "--net none reached the test's HTTP server"
ex a --net none -- sh -c "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
assert_eq lo "$OUT" "network interfaces with --net none"
kill "$HTTP_PID" 2> /dev/null || true
wait "$HTTP_PID" 2> /dev/null || true

log "--env and the git identity"
ex a --env FOO=bar -e EMPTY= -- sh -c 'printf "%s|%s|%s" "$FOO" "${EMPTY-unset}" "$HOME"'
assert_eq 0 "$RC" "exec with --env (stderr: $ERR)"
assert_eq "bar||/desk" "$OUT" "--env VAR=VALUE, an empty value, HOME"
PASSME=from-caller ex a --env PASSME -- sh -c 'printf %s "$PASSME"'
assert_eq from-caller "$OUT" "--env VAR passes the caller's value"
ex a --env NOT_SET_ANYWHERE_42 -- true
[[ $RC != 0 && $ERR == *"NOT_SET_ANYWHERE_42"* ]] || fail "--env of an unset variable must fail naming it (rc $RC, stderr: $ERR)"
ex a --env AWS_SECRET_ACCESS_KEY=leak -- sh -c 'printf %s "${AWS_SECRET_ACCESS_KEY-}"'
[[ $RC != 0 && $OUT != *leak* ]] || fail "--env must refuse credential variables (rc $RC, out: $OUT)"
GIT_AUTHOR_NAME="Desk Agent" GIT_AUTHOR_EMAIL=agent@example.com ex a -- sh -c 'printf "%s <%s>" "$GIT_AUTHOR_NAME" "$GIT_AUTHOR_EMAIL"'
assert_eq "Desk Agent <agent@example.com>" "$OUT" "the caller's git identity passes through"

log "host-side desk commands do not act on what the agent plants from inside"
mkdir -p "$T/host-victim"
echo keep > "$T/host-victim/old.txt"
touch -d '3 days ago' "$T/host-victim/old.txt"
ex a -- sh -c "rm -rf /desk/tmp && ln -s $T/host-victim /desk/tmp"
assert_eq 0 "$RC" "planting a symlink inside the desk (stderr: $ERR)"
out=$("$DESKFS" desk tidy a 2>&1) && fail "tidy must refuse a desk whose tmp/ is a symlink: $out"
[[ $out == *symlink* ]] || fail "tidy's error does not name the symlink: $out"
assert_eq keep "$(cat "$T/host-victim/old.txt")" "host file behind a planted tmp/ symlink"
rm "$MNT/desks/a/tmp" && mkdir "$MNT/desks/a/tmp"
ex a -- sh -c "printf '%s\n' '' >> /desk/AGENTS.md"
python3 - "$MNT/desks/a/AGENTS.md" "$T/ESCAPED" <<'PY'
import sys
p, target = sys.argv[1], sys.argv[2]
s = open(p).read()
end = "<!-- deskfs:manual:end -->"
i = s.index(end)
j = s.rindex("```", 0, i)
s = s[:j] + '[[tool]]\nname = "evil"\nversion = "2"\nversion_cmd = "touch %s; echo 1"\n' % target + s[j:]
open(p, "w").write(s)
PY
"$DESKFS" resume a > /dev/null 2>&1 || true
chk=$("$DESKFS" manual check a 2>&1 || true)
[[ $chk == *evil* ]] || fail "harness: the planted tool is not in the manual: $chk"
[[ ! -e $T/ESCAPED ]] || fail "a version command from AGENTS.md ran on the host"
out=$("$DESKFS" manual record a '$(touch '"$T"'/ESCAPED2)' 2>&1) && fail "a tool name with shell syntax was accepted: $out"
[[ ! -e $T/ESCAPED2 ]] || fail "a tool name ran as shell on the host"

ws_umount "$MNT"
log "ok"
