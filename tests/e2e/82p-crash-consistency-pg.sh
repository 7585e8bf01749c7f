#!/usr/bin/env bash
# 82p-crash-consistency-pg: 82-crash-consistency (kill -9 of the daemon mid-workload,
# `deskfs fsck`, remount, journal check; 15 iterations; final sync equals the bucket dir)
# with the workspace's metadata in PostgreSQL instead of SQLite: DESKFS_E2E_META=postgres
# makes ws_format add --meta postgres://… (a fresh database of the test server, see
# tests/lib.sh). `deskfs fsck NAME` reads the metadata URL from the workspace config; on
# problems the test keeps a pg_dump of the schema instead of a copy of meta.db. Needs
# PostgreSQL (need_pg). Knobs as in 82 (DESKFS_CRASH_ITERS, DESKFS_CRASH_SEED).
# e2e-cost: 40
# e2e-timeout: 900
export DESKFS_E2E_META=postgres DESKFS_E2E_NAME=82p-crash-consistency-pg
exec bash "$(dirname "$0")/82-crash-consistency.sh" "$@"
