#!/usr/bin/env bash
# 88-shared-bad-input: wrong uses of a workspace shared through PostgreSQL (root namespace,
# the test PostgreSQL server, Garage). Each gives exactly one error line on stderr that
# names the problem and the fix, a non-zero exit within 60 s, no panic, and changes
# nothing: the database (pg_dump of the test database, data and sequences included), the
# local DESKFS_HOMEs (every file and its bytes), the bucket (objects under the test's
# prefix) and, for a file:// bucket, its directory stay exactly as they were.
#   * malformed metadata URLs: bad port, unknown scheme, bad op_timeout, bad schema name
#   * an unreachable server (a closed port on 127.0.0.1), for format and attach
#   * a wrong password (PGPASSWORD), for format and attach
#   * attach to a schema holding no workspace; attach with another name than the
#     workspace recorded there; attach --bucket with another bucket than the recorded one
#   * format into a schema that already holds a workspace (without --force), with an S3
#     bucket and with a file:// bucket (no bucket directory may be left behind)
#   * a workspace database of a newer schema version (kv schema_version set to 99 by the
#     superuser): attach, mount and format are refused, and the version record stays 99
#   * mount when the local workspace.toml names another bucket than the database records
# Finally the real workspace still mounts from both homes and holds its file.
# e2e-cost: 32
# e2e-timeout: 300
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_pg
need_s3
need_cmd psql pg_dump

# ---------------------------------------------------------------- setup
DB_URL=$(pg_fresh_db badinput)
re='^postgres(ql)?://([^:@/]+)(:([^@/]*))?@([^/]+)/([^?]+)'
[[ $DB_URL =~ $re ]] || fail "cannot parse the test database URL"
PGU=${BASH_REMATCH[2]} PGPW=${BASH_REMATCH[4]} PGHP=${BASH_REMATCH[5]} DB_NAME=${BASH_REMATCH[6]}
export PGPASSWORD=$PGPW   # deskfs reads the password from here (never from workspace.toml)
BASE="postgres://$PGU@$PGHP/$DB_NAME"
META="$BASE?schema=ws&op_timeout=5"
HOME_A=$DESKFS_HOME   # the host that formatted the workspace
HOME_B=$T/home-b      # another host (an empty DESKFS_HOME)
mkdir -p "$HOME_B"
FILE_BUCKET=$T/filebucket   # must not appear (format into a taken schema, file:// bucket)

ws_format ws --meta "$META" --bucket "$(s3_url ws)" --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION"
ws_mount ws "$MNT"
echo "the real workspace" > "$MNT/keep.txt"
ws_umount "$MNT"
# asuper SQL: psql as the superuser on the test database
asuper() { PGCONNECT_TIMEOUT=10 timeout -k 5 60 psql -X -q -t -A -v ON_ERROR_STOP=1 "${DESKFS_TEST_PG_ADMIN:-$DB_URL} dbname=$DB_NAME" -c "$1"; }
asuper "CREATE SCHEMA empty_one AUTHORIZATION \"$PGU\"" > /dev/null   # a schema holding no workspace
assert_eq 1 "$(asuper "SELECT value FROM ws.kv WHERE key = 'schema_version'")" "schema_version of the new workspace (harness: crates/meta/src/postgres/schema.rs)"

# a closed port on 127.0.0.1: bound once by the kernel's choice, then released
CLOSED_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
! (exec 3<> "/dev/tcp/127.0.0.1/$CLOSED_PORT") 2> /dev/null || fail "port $CLOSED_PORT on 127.0.0.1 is open (harness)"

# ---------------------------------------------------------------- the state that must not change
snapshot() { # DIR: writes DIR/{db,home-a,home-b,bucket,filebucket}
  local d=$1
  mkdir -p "$d"
  PGCONNECT_TIMEOUT=10 timeout -k 5 60 pg_dump --no-owner --no-privileges "${DESKFS_TEST_PG_ADMIN:-$DB_URL} dbname=$DB_NAME" 2> "$d/db.err" |
    grep -v -e '^--' -e '^$' -e '^\\restrict' -e '^\\unrestrict' > "$d/db" || true
  [[ -s $d/db ]] || fail "pg_dump of $DB_NAME failed: $(head -c 300 "$d/db.err")"
  tree_manifest "$HOME_A" > "$d/home-a"
  tree_manifest "$HOME_B" > "$d/home-b"
  s3_keys > "$d/bucket" || fail "cannot list the bucket"
  if [[ -e $FILE_BUCKET ]]; then find "$FILE_BUCKET" | sort > "$d/filebucket"; else echo "(absent)" > "$d/filebucket"; fi
}
same_state() { # BEFORE AFTER WHAT: nothing changed
  local what=$3 x
  for x in db home-a home-b bucket filebucket; do
    if ! diff -u "$1/$x" "$2/$x" > "$T/state.diff"; then
      local name
      case $x in
        db) name="the database $DB_NAME (pg_dump)" ;;
        home-a) name="DESKFS_HOME of the formatting host ($HOME_A)" ;;
        home-b) name="DESKFS_HOME of the attaching host ($HOME_B)" ;;
        bucket) name="the bucket (objects under $S3_PREFIX/)" ;;
        filebucket) name="the file:// bucket directory $FILE_BUCKET" ;;
      esac
      bad "$what changed $name (- before, + after): $(grep '^[-+][^-+]' "$T/state.diff" | head -n 8 | cut -c1-200 | tr '\n' ' ')"
    fi
  done
}

BAD=()
bad() {
  printf 'FAILED CHECK: %s\n' "$*" >&2
  BAD+=("$*")
}

# refused WHAT PROBLEM_ERE FIX_ERE [ENV=VAL...] -- deskfs ARGS...: the command fails cleanly
# with one error line matching both EREs (case-insensitive), and changes nothing.
_case=0
refused() {
  local what=$1 problem=$2 fix=$3 rc=0 lines msg
  shift 3
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  _case=$((_case + 1))
  snapshot "$T/before.$_case"
  env -u RUST_LOG -u RUST_BACKTRACE -u DESKFS_LOG "${envs[@]}" timeout -k 5 60 "$DESKFS" "$@" > "$T/out.$_case" 2> "$T/err.$_case" < /dev/null || rc=$?
  msg=$(cat "$T/err.$_case")
  if ((rc == 0)); then
    bad "$what: deskfs $1 exited 0 (stdout: $(head -c 300 "$T/out.$_case"))"
  elif ((rc == 124 || rc == 137)); then
    bad "$what: no answer within 60 s (a bad input must fail fast)"
  elif ((rc >= 128)); then
    bad "$what: killed by signal $((rc - 128))"
  elif grep -q 'panicked at' "$T/err.$_case"; then
    bad "$what: panicked: $(head -c 600 "$T/err.$_case")"
  else
    lines=$(grep -c . "$T/err.$_case" || true)
    if [[ $lines != 1 ]]; then
      bad "$what: expected one error line on stderr, got $lines: $(head -c 800 "$T/err.$_case" | tr '\n' '|')"
    fi
    grep -Eqi -- "$problem" "$T/err.$_case" || bad "$what: the error does not name the problem (/$problem/): $msg"
    grep -Eqi -- "$fix" "$T/err.$_case" || bad "$what: the error does not say how to fix it (/$fix/): $msg"
    log "refused ($what, exit $rc): $msg"
  fi
  snapshot "$T/after.$_case"
  same_state "$T/before.$_case" "$T/after.$_case" "$what"
}
dB() { echo DESKFS_HOME="$HOME_B"; }

# ---------------------------------------------------------------- malformed URLs
log "=== malformed metadata URLs"
refused "format with a metadata URL whose port is not a number" \
  'bad metadata URL|invalid port' 'use postgres://USER@HOST:PORT/DATABASE' \
  -- format newws --meta "postgres://$PGU@127.0.0.1:99999/$DB_NAME?schema=newws" --bucket "$(s3_url newws)"
refused "attach with a metadata URL of an unknown scheme" \
  'bad metadata URL' 'use .*postgres://USER@HOST:PORT/DATABASE' \
  "$(dB)" -- attach ws --meta "mysql://$PGU@$PGHP/$DB_NAME"
refused "attach with op_timeout=abc in the metadata URL" \
  'op_timeout' 'positive number of seconds|op_timeout=SECONDS|use ' \
  "$(dB)" -- attach ws --meta "$BASE?schema=ws&op_timeout=abc"
refused "attach with schema=Bad-Name in the metadata URL" \
  'schema' 'lower-case letters|use ' \
  "$(dB)" -- attach ws --meta "$BASE?schema=Bad-Name"

# ---------------------------------------------------------------- unreachable server, wrong password
log "=== unreachable server, wrong password"
# the fix for these: check that the server runs / the host and port (resp. the password)
FIX_REACH='check|is (the server|postgresql) running|start|host and port|PGHOST|PGPORT'
FIX_PW='PGPASSWORD|pgpass|password in the URL|check the password'
refused "format with the metadata server at a closed port" \
  "127\.0\.0\.1:$CLOSED_PORT.*(refused|connect|reach)|(refused|connect|reach).*127\.0\.0\.1:$CLOSED_PORT" "$FIX_REACH" \
  -- format newws --meta "postgres://$PGU@127.0.0.1:$CLOSED_PORT/$DB_NAME?schema=newws&op_timeout=5" --bucket "$(s3_url newws)" \
  --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION"
refused "attach with the metadata server at a closed port" \
  "127\.0\.0\.1:$CLOSED_PORT.*(refused|connect|reach)|(refused|connect|reach).*127\.0\.0\.1:$CLOSED_PORT" "$FIX_REACH" \
  "$(dB)" -- attach ws --meta "postgres://$PGU@127.0.0.1:$CLOSED_PORT/$DB_NAME?schema=ws&op_timeout=5"
refused "format with a wrong password (PGPASSWORD)" \
  'password' "$FIX_PW" \
  PGPASSWORD=wrong-password -- format newws --meta "$BASE?schema=newws&op_timeout=5" --bucket "$(s3_url newws)" \
  --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION"
refused "attach with a wrong password (PGPASSWORD)" \
  'password' "$FIX_PW" \
  "$(dB)" PGPASSWORD=wrong-password -- attach ws --meta "$META"

# ---------------------------------------------------------------- attach: wrong schema, name, bucket
log "=== attach to the wrong place"
refused "attach to a schema that holds no workspace" \
  'no deskfs workspace' 'deskfs format|schema=' \
  "$(dB)" -- attach ws --meta "$BASE?schema=empty_one&op_timeout=5"
refused "attach to a schema that does not exist" \
  'no deskfs workspace' 'deskfs format|schema=' \
  "$(dB)" -- attach ws --meta "$BASE?schema=nothing_here&op_timeout=5"
refused "attach with another name than the workspace in that database" \
  'holds workspace "?ws"?.*not "?other"?|"?other"?.*not.*"?ws"?' 'attach with that name|deskfs attach ws|check the URL' \
  "$(dB)" -- attach other --meta "$META"
refused "attach --bucket with another bucket than the recorded one" \
  "differs|records|not the bucket" 'omit --bucket|give that one|--bucket' \
  "$(dB)" -- attach ws --meta "$META" --bucket "$(s3_url elsewhere)"

# ---------------------------------------------------------------- format into a taken schema
log "=== format into a schema that already holds a workspace"
refused "format (S3 bucket) into a schema that already holds workspace ws" \
  'already holds (a deskfs )?workspace' 'deskfs attach|--force' \
  -- format second --meta "$META" --bucket "$(s3_url second)" --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION"
refused "format (S3 bucket) from the other host into a schema that already holds workspace ws" \
  'already holds (a deskfs )?workspace' 'deskfs attach|--force' \
  "$(dB)" -- format ws --meta "$META" --bucket "$(s3_url ws2)" --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION"
refused "format (file:// bucket) into a schema that already holds workspace ws" \
  'already holds (a deskfs )?workspace' 'deskfs attach|--force' \
  -- format third --meta "$META" --bucket "file://$FILE_BUCKET"

# ---------------------------------------------------------------- a newer schema version
log "=== a workspace database of a newer schema version"
asuper "UPDATE ws.kv SET value = '99' WHERE key = 'schema_version'" > /dev/null
assert_eq 99 "$(asuper "SELECT value FROM ws.kv WHERE key = 'schema_version'")" "harness: schema_version set to 99"
refused "attach to a workspace database of schema version 99" \
  'version 99|newer' 'upgrade deskfs|newer deskfs' \
  "$(dB)" -- attach ws --meta "$META"
mkdir -p "$T/m-newer"
register_mount "$T/m-newer"
refused "mount of a workspace whose database has schema version 99" \
  'version 99|newer' 'upgrade deskfs|newer deskfs' \
  -- mount ws "$T/m-newer"
not_mounted "$T/m-newer" || bad "a workspace whose database has schema version 99 got mounted"
refused "format into a schema holding a workspace of schema version 99 (without --force)" \
  'version 99|newer|already holds' 'upgrade deskfs|--force' \
  -- format fourth --meta "$META" --bucket "$(s3_url fourth)" --endpoint "$BENCH_S3_ENDPOINT" --region "$BENCH_S3_REGION"
assert_eq 99 "$(asuper "SELECT value FROM ws.kv WHERE key = 'schema_version'")" "schema_version after the refused commands"
asuper "UPDATE ws.kv SET value = '1' WHERE key = 'schema_version'" > /dev/null

# ---------------------------------------------------------------- mount with another bucket in workspace.toml
log "=== mount with a workspace.toml naming another bucket"
CFG=$HOME_A/workspaces/ws/workspace.toml
cp -p "$CFG" "$T/workspace.toml.orig"
grep -q "^bucket = \"$(s3_url ws)\"" "$CFG" || fail "harness: $CFG does not name $(s3_url ws): $(cat "$CFG")"
sed -i "s#^bucket = \".*\"#bucket = \"$(s3_url moved)\"#" "$CFG"
mkdir -p "$T/m-moved"
register_mount "$T/m-moved"
refused "mount when workspace.toml names another bucket than the database records" \
  'bucket' 'fix .?bucket.? in|workspace\.toml' \
  -- mount ws "$T/m-moved"
not_mounted "$T/m-moved" || bad "the workspace got mounted with another bucket than the database records"
cp -p "$T/workspace.toml.orig" "$CFG"

# ---------------------------------------------------------------- the real workspace is intact
log "=== the workspace still works, from both homes"
DESKFS_HOME=$HOME_B dfs_ok attach ws --meta "$META"
! grep -qF "$PGPW" "$HOME_B/workspaces/ws/workspace.toml" || bad "the password is stored in the attaching host's workspace.toml"
ws_mount ws "$MNT"
assert_eq "the real workspace" "$(cat "$MNT/keep.txt")" "keep.txt through the formatting host's mount"
ws_umount "$MNT"
mkdir -p "$MNT2"
register_mount "$MNT2"
DESKFS_HOME=$HOME_B ws_mount ws "$MNT2"
assert_eq "the real workspace" "$(cat "$MNT2/keep.txt")" "keep.txt through the attaching host's mount"
DESKFS_HOME=$HOME_B ws_umount "$MNT2"

if ((${#BAD[@]})); then
  printf '  failed: %s\n' "${BAD[@]}" >&2
  fail "${#BAD[@]} check(s) failed; first: ${BAD[0]}"
fi
log "PASS"
