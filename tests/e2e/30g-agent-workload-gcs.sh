#!/usr/bin/env bash
# 30g-agent-workload-gcs: 30-agent-workload on a gs:// workspace in
# a private fake-gcs-server behind tests/gcs_xml_shim.py (tests/store.sh, scripts/gcs-server.sh):
# git clone/commit/merge, make, cargo, venv and two SQLite databases on the mount; every
# file an object of the same size (a sample read with tests/gcsjson.py, byte-exact); a
# cold remount gives the same tree, git fsck clean, make up to date.
# e2e-cost: 57
# e2e-timeout: 1200
export DESKFS_E2E_STORE=gcs DESKFS_E2E_NAME=30g-agent-workload-gcs
exec bash "$(dirname "$0")/30-agent-workload.sh" "$@"
