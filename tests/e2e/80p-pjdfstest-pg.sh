#!/usr/bin/env bash
# 80p-pjdfstest-pg: 80-pjdfstest (pjdfstest 0.2.2 on an --allow-other mount of a workspace
# with the local bucket dir) with the workspace's metadata in PostgreSQL instead of SQLite:
# DESKFS_E2E_META=postgres makes ws_format add --meta postgres://… (a fresh database of the
# test server, see tests/lib.sh). Same output (pjdfstest: N passed, N failed, N skipped) and
# the same verdict: fails on any pjdfstest failure. Needs PostgreSQL (need_pg).
# e2e-timeout: 1200
export DESKFS_E2E_META=postgres DESKFS_E2E_NAME=80p-pjdfstest-pg
exec bash "$(dirname "$0")/80-pjdfstest.sh" "$@"
