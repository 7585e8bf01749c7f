#!/usr/bin/env bash
# 86p-coherence-pg: 86-coherence-two-mounts (three mounts on one host, A and B sharing a
# cache dir, C with its own; trunc-rewrite, close-to-open, handover, git-refs, sqlite,
# rename-storm) with the workspace's metadata in PostgreSQL: DESKFS_E2E_META=postgres
# makes ws_format add --meta postgres://… (a fresh database of the test server, see
# tests/lib.sh). PostgreSQL's timing (one round trip per operation, the NOTIFY-driven
# feed) exercises the races between a rename over a name and a reader on another cache
# that SQLite's single file hides. Needs PostgreSQL (need_pg).
# e2e-cost: 95
# e2e-timeout: 600
export DESKFS_E2E_META=postgres DESKFS_E2E_NAME=86p-coherence-pg
exec bash "$(dirname "$0")/86-coherence-two-mounts.sh" "$@"
