#!/usr/bin/env bash
# 30z-agent-workload-azure: 30-agent-workload on an az:// workspace in a private Azurite (tests/store.sh, scripts/azurite.sh):
# git clone/commit/merge, make, cargo, venv and two SQLite databases on the mount; every
# file a blob of the same size (a sample read with tests/azblob.py, byte-exact); a cold
# remount gives the same tree, git fsck clean, make up to date. Proves Azure's block
# uploads, renames (copy + delete) and folder blobs keep an agent's workspace whole.
# e2e-cost: 70
# e2e-timeout: 1200
export DESKFS_E2E_STORE=azure DESKFS_E2E_NAME=30z-agent-workload-azure
exec bash "$(dirname "$0")/30-agent-workload.sh" "$@"
