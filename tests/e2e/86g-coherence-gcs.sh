#!/usr/bin/env bash
# 86g-coherence-gcs: 86-coherence-two-mounts with the workspace in
# a private fake-gcs-server behind tests/gcs_xml_shim.py (tests/store.sh, scripts/gcs-server.sh)
# (DESKFS_E2E_STORE=gcs: ws_format adds --bucket gs://…): three mounts, A and B sharing a
# cache dir, C with its own, so C reads what A wrote through GCS (uploads on request)
# with no missing names and no stale or torn content.
# e2e-cost: 85
# e2e-timeout: 600
export DESKFS_E2E_STORE=gcs DESKFS_E2E_NAME=86g-coherence-gcs
exec bash "$(dirname "$0")/86-coherence-two-mounts.sh" "$@"
