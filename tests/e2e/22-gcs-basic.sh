#!/usr/bin/env bash
# 22-gcs-basic: a gs:// workspace on fake-gcs-server (a Google Cloud Storage emulator, a
# private one started by this test with scripts/gcs-server.sh: in-memory, a free port on
# 127.0.0.1, plain http, stopped at exit). deskfs reaches it with object_store's own
# variable GOOGLE_SERVICE_ACCOUNT_KEY: a fake key with disable_oauth and gcs_base_url.
# The emulator takes no XML-API PUT, so tests/gcs_xml_shim.py (started by the script)
# turns object_store's XML writes into its JSON API. Checked without deskfs (tests/gcsjson.py,
# the emulator's JSON API):
#   - format with GOOGLE_BASE_URL and no credential: one line naming the variables,
#     non-zero, no workspace dir, no object (it would wait on the GCE metadata service);
#   - format / mount: the lease's conditional renewal (If-Match -> GCS generation
#     precondition: "Version required for conditional update" made every mount's lease
#     fail before Bucket::generation_if_etag);
#   - write / read / mkdir / rename (file and dir) / unlink / overwrite / a 20 MB file
#     (> the 16 MiB multipart threshold: XML multipart upload), `deskfs sync`: every
#     object has its exact content and the POSIX metadata (mode, deskfs-mtime-ns), an
#     empty dir is a `dir/` marker, removed names are gone;
#   - cold remount (fresh cache dir): the same tree, byte for byte;
#   - a bucket prefix prefilled by another client mounts as is: listed and read.
# Skipped (failed under DESKFS_TEST_STRICT=1) only when the emulator cannot be installed.
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/backend.sh
source "$LIB_DIR/backend.sh"
need_deskfs
need_cmd python3

# ---- a private fake-gcs-server + its XML shim (tests/store.sh; gj = tests/gcsjson.py)
need_store gcs
PORT=$STORE_PORT
B=$GCS_BUCKET
PREFIX="e2e-gcs-$(date +%Y%m%d%H%M%S)-$$"
gj_keys() { gj ls "${1:-$PREFIX/}"; }
gj_exists() { gj meta "$1" > /dev/null 2>&1; }
obj_get() { gj get "$1"; }
obj_present() { # REL KIND (a directory's marker is REL/)
  local key=$PREFIX/$1
  [[ $2 == dir ]] && key=$key/
  gj_keys | cut -f2 | grep -xF "$key" > /dev/null # (not -q: its early exit would be a SIGPIPE under pipefail)
}

WSD=$DESKFS_HOME/workspaces
log "format on a custom endpoint with no credential: one line, non-zero, nothing left"
rc=0
env -u RUST_LOG -u GOOGLE_SERVICE_ACCOUNT_KEY GOOGLE_BASE_URL="http://127.0.0.1:$PORT" \
  timeout -k 5 60 "$DESKFS" format nocreds --bucket "gs://$B/$PREFIX-nocreds" > "$T/err.out" 2> "$T/err.err" < /dev/null || rc=$?
((rc != 0 && rc != 124)) || fail "format with no GCS credential: exit $rc: $(head -c 400 "$T/err.err")"
[[ $(grep -c . "$T/err.err") == 1 ]] || fail "format with no GCS credential: not one line: $(head -c 800 "$T/err.err")"
grep -q 'GOOGLE_SERVICE_ACCOUNT_KEY' "$T/err.err" || fail "the error does not name the variable: $(cat "$T/err.err")"
[[ ! -e $WSD/nocreds ]] || fail "format with no GCS credential left $WSD/nocreds behind"
[[ -z $(gj_keys "$PREFIX-nocreds/") ]] || fail "format with no GCS credential left objects"
log "ok (exit $rc): $(cat "$T/err.err")"

NAME=gcsbasic
log "deskfs format $NAME --bucket gs://$B/$PREFIX"
ws_format "$NAME" --bucket "gs://$B/$PREFIX"
gj_exists "$PREFIX/.deskfs/format.json" || fail "format wrote no $PREFIX/.deskfs/format.json"

ws_mount "$NAME" "$MNT" --cache-dir "$T/cache1"
M=$MNT
backend_write_tree "$M"
ws_sync "$NAME"

log "checking the bucket after sync"
backend_check_tree
gj_keys > "$T/keys.1"
grep -qxF "0	$PREFIX/zero.txt" "$T/keys.1" || fail "no empty object $PREFIX/zero.txt (objects: $(cut -f2 "$T/keys.1" | tr '\n' ' '))"
gj meta "$PREFIX/a/b/c.txt" > "$T/meta.c" || fail "no metadata of a/b/c.txt"
grep -qx 'mode=33188' "$T/meta.c" || fail "a/b/c.txt carries no mode 33188 metadata: $(tr '\n' ' ' < "$T/meta.c")"
grep -qx 'deskfs-mtime-ns=981173106123456789' "$T/meta.c" || fail "a/b/c.txt carries no ns mtime: $(tr '\n' ' ' < "$T/meta.c")"
grep -qxF "0	$PREFIX/emptydir/" "$T/keys.1" || fail "no directory marker $PREFIX/emptydir/ (objects: $(cut -f2 "$T/keys.1" | tr '\n' ' '))"
backend_no_failing_uploads

backend_change_tree "$M"
backend_check_changed

backend_cold_remount "$NAME" "$M" "$MNT2"

log "a prefix prefilled by another client"
P2=$PREFIX-pre
backend_prefill_files
gj put "$P2/x.txt" "$T/x.txt"
gj put "$P2/sub/deeper/y.bin" "$T/y.bin"
gj put "$P2/emptyd/" /dev/null
gj put "$P2/emptyf" /dev/null
ws_format pre --bucket "gs://$B/$P2"
ws_mount pre "$MNT" --cache-dir "$T/cache3"
assert_eq "$(printf '%s\n' emptyd emptyf sub x.txt)" "$(ls "$MNT")" "listing of the prefilled prefix"
[[ -d $MNT/emptyd ]] || fail "the marker emptyd/ is not a directory: $(stat -c %F "$MNT/emptyd")"
[[ -f $MNT/emptyf && ! -s $MNT/emptyf ]] || fail "the empty object emptyf is not an empty file: $(stat -c '%F %s' "$MNT/emptyf")"
assert_file_eq "$T/x.txt" "$MNT/x.txt" "prefilled x.txt"
assert_file_eq "$T/y.bin" "$MNT/sub/deeper/y.bin" "prefilled sub/deeper/y.bin"
echo "added" > "$MNT/sub/added.txt"
ws_sync pre
echo "added" > "$T/e.add"
PREFIX=$P2 obj_eq sub/added.txt "$T/e.add"
ws_umount "$MNT"

log "PASS"
