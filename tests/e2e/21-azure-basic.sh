#!/usr/bin/env bash
# 21-azure-basic: an az:// workspace on Azurite (Microsoft's Azure Storage emulator, a
# private one started by this test with scripts/azurite.sh: own state dir, a free port on
# 127.0.0.1, stopped at exit). Checked without deskfs (tests/azblob.py, SharedKey):
#   - format with no account, or a wrong account key: one line, non-zero, nothing left
#     (no workspace dir, no blob under the prefix); format from a connection string works;
#   - write / read / mkdir / rename (file and dir) / unlink / overwrite / a 20 MB file
#     (block upload, > the 16 MiB multipart threshold), `deskfs sync`: every blob has its
#     exact content and the POSIX metadata under Azure-valid names (x-ms-meta-mode,
#     x-ms-meta-deskfs_mtime_ns: a hyphen there was a 400 InvalidMetadata on every
#     upload), an empty dir is a blob with hdi_isfolder=true, removed names are gone;
#   - cold remount (fresh cache dir): the same tree, byte for byte;
#   - a container prefix prefilled by another client mounts as is: listed and read, an
#     empty blob with hdi_isfolder=true is a directory, one without an empty file;
#   - a permanent 4xx (Azurite restarted with another account key: 403 to every upload):
#     `deskfs status` lists the failing upload with the server's answer, `deskfs umount
#     --timeout 5` returns within its bound with exit 3; with the key back, a remount and
#     sync upload it.
# Skipped (failed under DESKFS_TEST_STRICT=1) only when Azurite cannot be installed.
# e2e-cost: 102
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/backend.sh
source "$LIB_DIR/backend.sh"
need_deskfs
need_cmd python3

# ---- a private Azurite (tests/store.sh: az_ctl, az_up, AZ_STATE; az = tests/azblob.py)
need_store azure
C=$AZURITE_CONTAINER
PREFIX="e2e-az-$(date +%Y%m%d%H%M%S)-$$"
az_keys() { az ls "${1:-$PREFIX/}"; }
az_exists() { az head "$1" > /dev/null 2>&1; }
obj_get() { az get "$1"; }
obj_present() { az_exists "$PREFIX/$1"; } # REL KIND (a directory's marker has its name)
WSD=$DESKFS_HOME/workspaces

# ---- bad credentials at format: one line, non-zero, nothing left behind
bad_format() { # WHAT PATTERN NAME ENV-ARGS...
  local what=$1 pat=$2 name=$3 rc=0 lines
  shift 3
  env -u RUST_LOG "$@" timeout -k 5 60 "$DESKFS" format "$name" --bucket "az://$C/$PREFIX-$name" \
    > "$T/err.out" 2> "$T/err.err" < /dev/null || rc=$?
  ((rc != 0 && rc != 124)) || fail "$what: exit $rc: $(head -c 400 "$T/err.err")"
  lines=$(grep -c . "$T/err.err" || true)
  [[ $lines == 1 ]] || fail "$what: expected one line on stderr, got $lines: $(head -c 800 "$T/err.err")"
  grep -Eq -- "$pat" "$T/err.err" || fail "$what: the error does not name the cause (/$pat/): $(cat "$T/err.err")"
  [[ ! -e $WSD/$name ]] || fail "$what: left the workspace dir $WSD/$name behind"
  [[ -z $(az_keys "$PREFIX-$name/") ]] || fail "$what: left blobs under $PREFIX-$name/"
  log "ok ($what, exit $rc): $(cat "$T/err.err")"
}
bad_format "format with no Azure account" 'AZURE_STORAGE_ACCOUNT_NAME' nocreds \
  -u AZURE_STORAGE_ACCOUNT_NAME -u AZURE_STORAGE_ACCOUNT_KEY -u AZURE_STORAGE_CONNECTION_STRING
bad_format "format with an account but no key on Azurite" 'AZURE_STORAGE_ACCOUNT_KEY' nokey \
  -u AZURE_STORAGE_ACCOUNT_KEY -u AZURE_STORAGE_CONNECTION_STRING
WRONG=$(head -c 64 /dev/urandom | base64 -w0)
bad_format "format with a wrong account key" '403|denied|AZURE_STORAGE_ACCOUNT_KEY' wrongkey \
  -u AZURE_STORAGE_CONNECTION_STRING AZURE_STORAGE_ACCOUNT_KEY="$WRONG"

# ---- format from the connection string alone
NAME=azbasic
log "deskfs format $NAME --bucket az://$C/$PREFIX (AZURE_STORAGE_CONNECTION_STRING only)"
out=$(env -u AZURE_STORAGE_ACCOUNT_NAME -u AZURE_STORAGE_ACCOUNT_KEY -u AZURE_STORAGE_ENDPOINT \
  timeout -k 5 120 "$DESKFS" format "$NAME" --bucket "az://$C/$PREFIX" 2>&1 < /dev/null) ||
  fail "deskfs format with a connection string failed: $out"
az_exists "$PREFIX/.deskfs/format.json" || fail "format wrote no $PREFIX/.deskfs/format.json"

ws_mount "$NAME" "$MNT" --cache-dir "$T/cache1"
M=$MNT
backend_write_tree "$M"
ws_sync "$NAME"

log "checking the container after sync"
backend_check_tree
az_keys > "$T/keys.1"
grep -qxF "0	$PREFIX/zero.txt" "$T/keys.1" || fail "no empty blob $PREFIX/zero.txt (blobs: $(cut -f2 "$T/keys.1" | tr '\n' ' '))"
az head "$PREFIX/a/b/c.txt" > "$T/head.c" || fail "HEAD of a/b/c.txt failed"
grep -qx 'x-ms-meta-mode: 33188' "$T/head.c" || fail "a/b/c.txt carries no mode 33188 metadata: $(grep meta "$T/head.c" | tr '\n' ' ')"
grep -qx 'x-ms-meta-deskfs_mtime_ns: 981173106123456789' "$T/head.c" ||
  fail "a/b/c.txt carries no ns mtime under an Azure-valid name: $(grep meta "$T/head.c" | tr '\n' ' ')"
az head "$PREFIX/emptydir" > "$T/head.d" || fail "no directory marker blob $PREFIX/emptydir"
grep -qix 'x-ms-meta-hdi_isfolder: true' "$T/head.d" || fail "the marker of emptydir has no hdi_isfolder=true: $(grep meta "$T/head.d" | tr '\n' ' ')"
backend_no_failing_uploads

backend_change_tree "$M"
backend_check_changed

backend_cold_remount "$NAME" "$M" "$MNT2"

log "a prefix prefilled by another client"
P2=$PREFIX-pre
backend_prefill_files
az put "$P2/x.txt" "$T/x.txt"
az put "$P2/sub/deeper/y.bin" "$T/y.bin"
# Azure's folder convention (what deskfs writes for an empty dir; Storage Explorer too)
# next to a plain empty blob: a directory and an empty file.
az put "$P2/emptyd" /dev/null hdi_isfolder=true
az put "$P2/emptyf" /dev/null
ws_format pre --bucket "az://$C/$P2"
ws_mount pre "$MNT" --cache-dir "$T/cache3"
assert_eq "$(printf '%s\n' emptyd emptyf sub x.txt)" "$(ls "$MNT")" "listing of the prefilled prefix"
[[ -d $MNT/emptyd ]] || fail "the blob emptyd with hdi_isfolder=true is not a directory: $(stat -c %F "$MNT/emptyd")"
[[ -f $MNT/emptyf && ! -s $MNT/emptyf ]] || fail "the empty blob emptyf is not an empty file: $(stat -c '%F %s' "$MNT/emptyf")"
assert_file_eq "$T/x.txt" "$MNT/x.txt" "prefilled x.txt"
assert_file_eq "$T/y.bin" "$MNT/sub/deeper/y.bin" "prefilled sub/deeper/y.bin"
echo "added" > "$MNT/sub/added.txt"
ws_sync pre
echo "added" > "$T/e.add"
PREFIX=$P2 obj_eq sub/added.txt "$T/e.add"
ws_umount "$MNT"

log "a permanent 4xx: Azurite restarted with another account key (403 to every request)"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache2"
cp "$AZ_STATE/azurite/creds" "$T/creds.good"
az_ctl stop > /dev/null 2>&1
echo "KEY=$WRONG" > "$AZ_STATE/azurite/creds"
az_up || fail "restarting Azurite with another key failed: $(tail -n 3 "$T/az-start.log")"
echo "written while refused" > "$MNT/refused.txt"
echo "written while refused" > "$T/e.refused"
refused_listed() { dfs status "$NAME" > "$T/status.out" 2>&1; grep -q 'failing *refused.txt.*403' "$T/status.out"; }
wait_for 60 refused_listed ||
  fail "status does not list refused.txt as failing with the server's 403: $(dfs status "$NAME" 2>&1 | tail -n 5)"
log "status: $(grep 'failing *refused.txt' "$T/status.out" | tr -s ' ' | head -c 500)"
start=$SECONDS
rc=0
DFS_TIMEOUT=120 dfs umount "$MNT" --timeout 5 > "$T/umount.out" 2>&1 || rc=$?
took=$((SECONDS - start))
log "umount --timeout 5: exit $rc after $took s: $(head -c 500 "$T/umount.out")"
((rc == 3)) || fail "deskfs umount --timeout 5 with a refused upload: exit $rc, expected 3: $(cat "$T/umount.out")"
((took <= 30)) || fail "deskfs umount --timeout 5 took $took s"
grep -q 'refused.txt' "$T/umount.out" || fail "umount does not name the refused upload: $(cat "$T/umount.out")"
not_mounted "$MNT" || fail "$MNT still mounted after umount --timeout"
az_ctl stop > /dev/null 2>&1
cp "$T/creds.good" "$AZ_STATE/azurite/creds"
az_up || fail "restarting Azurite with the right key failed"
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache2"
ws_sync "$NAME"
obj_eq refused.txt "$T/e.refused"
ws_umount "$MNT"

log "PASS"
