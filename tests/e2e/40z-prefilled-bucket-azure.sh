#!/usr/bin/env bash
# 40z-prefilled-bucket-azure: 40-prefilled-bucket on a private Azurite (tests/store.sh, scripts/azurite.sh):
# a container prefix filled by another client (tests/azblob.py put-tree: 1,000 blobs in one
# dir, a 64 MiB blob, nested names with no folder blobs, one empty blob with
# hdi_isfolder=true, Azure's folder convention) mounts as is; format and a read-only
# mount change no blob; sizes and sha256 exact, also after a cold remount.
# e2e-cost: 34
# e2e-timeout: 900
export DESKFS_E2E_STORE=azure DESKFS_E2E_NAME=40z-prefilled-bucket-azure
exec bash "$(dirname "$0")/40-prefilled-bucket.sh" "$@"
