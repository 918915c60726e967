#!/usr/bin/env bash
# Regenerate patches/ from a development checkout of the vendored llama.cpp.
#
#   bash scripts/export_patches.sh DIR BASE
#
# DIR: a git checkout of the sdist's vendor/llama.cpp where each patch is one commit on top of BASE (the
# unpatched tree). Commit subjects become the patch names (0001-kv-hook-c-api.patch, ...).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:?usage: export_patches.sh DIR BASE}"
BASE="${2:?usage: export_patches.sh DIR BASE}"
rm -f "$ROOT"/patches/*.patch
git -C "$DIR" format-patch --no-signature --zero-commit --no-stat -o "$ROOT/patches" "$BASE..HEAD"
ls "$ROOT/patches"
