#!/usr/bin/env bash
# 55g-outage-gcs: 55-s3-outage on a gs:// workspace in
# a private fake-gcs-server behind tests/gcs_xml_shim.py (tests/store.sh, scripts/gcs-server.sh):
# the XML shim every deskfs request goes through is stopped while uploads are pending
# (connection refused; the in-memory emulator keeps its objects) and started again on the
# same port: writes, renames and cached reads work during the outage, status shows the
# pending work, sync does not claim success while it is down and finishes after; every
# file is an object with its content, the old name is gone.
# e2e-cost: 38
# e2e-timeout: 900
export DESKFS_E2E_STORE=gcs DESKFS_E2E_NAME=55g-outage-gcs
exec bash "$(dirname "$0")/55-s3-outage.sh" "$@"
