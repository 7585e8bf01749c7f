#!/usr/bin/env bash
# 86z-coherence-azure: 86-coherence-two-mounts with the workspace in a private Azurite (tests/store.sh, scripts/azurite.sh)
# (DESKFS_E2E_STORE=azure: ws_format adds --bucket az://…): three mounts, A and B sharing
# a cache dir, C with its own, so C reads what A wrote through Azure (uploads on request)
# with no missing names and no stale or torn content.
# e2e-cost: 100
# e2e-timeout: 600
export DESKFS_E2E_STORE=azure DESKFS_E2E_NAME=86z-coherence-azure
exec bash "$(dirname "$0")/86-coherence-two-mounts.sh" "$@"
