#!/usr/bin/env bash
# 86b-coherence-s3: 86-coherence-two-mounts with the workspace on the S3 test server
# (DESKFS_E2E_STORE=s3: ws_format adds --bucket s3://…, credentials from AWS_*) instead of
# the local bucket dir: three mounts, A and B sharing a cache dir, C with its own, so C
# reads what A wrote through S3 (uploads on request) with no missing names and no stale or
# torn content. With 86z (Azure) and 86g (GCS) the two-mounts test runs on every store.
# Needs the S3 server (need_s3, through ws_format).
# e2e-timeout: 600
export DESKFS_E2E_STORE=s3 DESKFS_E2E_NAME=86b-coherence-s3
exec bash "$(dirname "$0")/86-coherence-two-mounts.sh" "$@"
