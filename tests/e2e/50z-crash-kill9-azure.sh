#!/usr/bin/env bash
# 50z-crash-kill9-azure: 50-crash-kill9 on an az:// workspace in a private Azurite (tests/store.sh, scripts/azurite.sh):
# what fsync and close acknowledged survives kill -9 of the daemon (remount with the same
# cache dir, the SQLite redo log replayed), and after `deskfs sync` every file is a blob
# with its exact bytes (zero-length ones included).
# e2e-cost: 49
# e2e-timeout: 600
export DESKFS_E2E_STORE=azure DESKFS_E2E_NAME=50z-crash-kill9-azure
exec bash "$(dirname "$0")/50-crash-kill9.sh" "$@"
