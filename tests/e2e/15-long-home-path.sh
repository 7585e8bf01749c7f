#!/usr/bin/env bash
# 15-long-home-path: a DESKFS_HOME deep enough that the daemon's control socket path
# would exceed the Unix socket limit (108 bytes) still formats, mounts, syncs, reports
# status and unmounts (regression: the mount used to fail with "path must be shorter
# than SUN_LEN").
source "$(dirname "$0")/../lib.sh"
need_deskfs

DESKFS_HOME=$T/a-rather-long-directory-name-for-the-data/and-another-level-of-nesting/deskfs-home
export DESKFS_HOME
mkdir -p "$DESKFS_HOME"
(( ${#DESKFS_HOME} > 100 )) || fail "test setup: DESKFS_HOME is only ${#DESKFS_HOME} bytes"

ws_format deep
ws_mount deep "$MNT"
echo "deep home" > "$MNT/f.txt"
dfs status deep --json > "$T/status.json" || fail "status failed with a long DESKFS_HOME"
grep -q '"mounts"' "$T/status.json" || fail "status --json has no mounts"
dfs sync deep || fail "sync failed with a long DESKFS_HOME"
[[ $(cat "$DESKFS_HOME/workspaces/deep/bucket/f.txt") == "deep home" ]] || fail "file not in the bucket dir after sync"
ws_umount "$MNT"
log "PASS"
