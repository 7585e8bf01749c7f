#!/usr/bin/env bash
# 55z-outage-azure: 55-s3-outage on an az:// workspace in a private Azurite (tests/store.sh, scripts/azurite.sh):
# Azurite is stopped while uploads are pending (its blobs stay in its state dir) and
# started again on the same port: writes, renames and cached reads work during the
# outage, status shows the pending work, sync does not claim success while it is down
# and finishes after; every file is a blob with its content, the old name is gone.
# e2e-cost: 66
# e2e-timeout: 900
export DESKFS_E2E_STORE=azure DESKFS_E2E_NAME=55z-outage-azure
exec bash "$(dirname "$0")/55-s3-outage.sh" "$@"
