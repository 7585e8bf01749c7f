#!/usr/bin/env bash
# 50g-crash-kill9-gcs: 50-crash-kill9 on a gs:// workspace in
# a private fake-gcs-server behind tests/gcs_xml_shim.py (tests/store.sh, scripts/gcs-server.sh):
# what fsync and close acknowledged survives kill -9 of the daemon, and after
# `deskfs sync` every file is an object with its exact bytes.
# e2e-cost: 40
# e2e-timeout: 600
export DESKFS_E2E_STORE=gcs DESKFS_E2E_NAME=50g-crash-kill9-gcs
exec bash "$(dirname "$0")/50-crash-kill9.sh" "$@"
