#!/usr/bin/env bash
# 81p-fsx-pg: 81-fsx (tests/tools/fsx.py: random ops compared with a local reference, a
# remount mid-run, a 1 MiB cache, bucket dir equal to the reference) with the workspace's
# metadata in PostgreSQL instead of SQLite: DESKFS_E2E_META=postgres makes ws_format add
# --meta postgres://… (a fresh database of the test server, see tests/lib.sh). Needs
# PostgreSQL (need_pg). Knobs as in 81-fsx (DESKFS_FSX_SEEDS, DESKFS_FSX_OPS).
# e2e-cost: 34
# e2e-timeout: 900
export DESKFS_E2E_META=postgres DESKFS_E2E_NAME=81p-fsx-pg
exec bash "$(dirname "$0")/81-fsx.sh" "$@"
