#!/usr/bin/env bash
# 40g-prefilled-bucket-gcs: 40-prefilled-bucket on a private fake-gcs-server behind tests/gcs_xml_shim.py (tests/store.sh, scripts/gcs-server.sh):
# a bucket prefix filled through the JSON API (tests/gcsjson.py put-tree: 1,000 objects in
# one dir, a 64 MiB object, nested names with no markers, one `dir/` marker) mounts as
# is; format and a read-only mount change no object; sizes and sha256 exact, also after
# a cold remount.
# e2e-timeout: 900
export DESKFS_E2E_STORE=gcs DESKFS_E2E_NAME=40g-prefilled-bucket-gcs
exec bash "$(dirname "$0")/40-prefilled-bucket.sh" "$@"
