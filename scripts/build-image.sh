#!/usr/bin/env bash
# Builds the felixrs image from the Containerfile with the first container builder that works
# here: podman, buildah, or docker (with a reachable daemon).
#
# Usage: scripts/build-image.sh [IMAGE]      default IMAGE: felixrs/felixrs:<workspace version>
#        BUILDER=docker scripts/build-image.sh  to choose the builder
# Exit status 2 when no builder is usable (the image cannot be built on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
image=${1:-felixrs/felixrs:$version}

usable() {
  case "$1" in
    podman) command -v podman >/dev/null && podman info >/dev/null 2>&1 ;;
    buildah) command -v buildah >/dev/null && buildah info >/dev/null 2>&1 ;;
    docker) command -v docker >/dev/null && docker info >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

builder=${BUILDER:-}
if [ -z "$builder" ]; then
  for b in podman buildah docker; do
    if usable "$b"; then builder=$b; break; fi
  done
fi
if [ -z "$builder" ] || ! usable "$builder"; then
  echo "build-image: no usable container builder (podman, buildah, or docker with a daemon)" >&2
  exit 2
fi
echo "==> $builder building $image"
case "$builder" in
  buildah) exec buildah bud --layers -f Containerfile -t "$image" . ;;
  *) exec "$builder" build -f Containerfile -t "$image" . ;;
esac
