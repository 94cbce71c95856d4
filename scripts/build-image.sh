#!/usr/bin/env bash
# Builds the felixrs image, on a machine with no registry too:
#   1. the workspace's release build (`cargo build --release --locked`, the pinned toolchain),
#      stripped of debug info and staged in target/image/ with an SBOM of its Rust crates
#      (scripts/sbom.py, CycloneDX);
#   2. where mmdebstrap is installed, the base: Debian's minbase plus the packages the
#      Containerfile's RUNTIME_PACKAGES names, without docs, imported as
#      localhost/felixrs-base:<release>-<hash>; the tarball is cached in target/image-base/ (a
#      week); without mmdebstrap, with buildah, or with FELIXRS_BASE=pull: the Containerfile's
#      pulled bases;
#   3. the Containerfile, then a smoke test: both binaries print their version in the image.
# Prints the image's size and the build time.
#
# Usage: scripts/build-image.sh [IMAGE]      default IMAGE: felixrs/felixrs:<workspace version>
#        BUILDER=docker scripts/build-image.sh  to choose the builder (podman, buildah, docker)
#        FELIXRS_VERSION_EXTRA=next ...         `--version` says <version>+next, default IMAGE
#                                               felixrs/felixrs:<version>-next (the upgrade test's)
# Exit status 2 when no builder is usable (the image cannot be built on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
image=${1:-felixrs/felixrs:$version${FELIXRS_VERSION_EXTRA:+-$FELIXRS_VERSION_EXTRA}}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/scripts/podman-containers.conf}

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

arg() { # NAME: the default of `ARG NAME=...` in the Containerfile
  sed -n "s/^ARG $1=\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" Containerfile | head -1
}
build_args=()
base=
# The base from Debian's packages needs `import` (podman, docker); buildah pulls.
if [ "${FELIXRS_BASE:-auto}" != pull ] && [ "$builder" != buildah ] && command -v mmdebstrap >/dev/null; then
  release=$(arg DEBIAN_RELEASE)
  packages=$(arg RUNTIME_PACKAGES)
  [ -n "$release" ] && [ -n "$packages" ] || { echo "build-image: no DEBIAN_RELEASE/RUNTIME_PACKAGES in Containerfile" >&2; exit 1; }
  mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  opts=(--variant=minbase --include="${packages// /,}"
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --aptopt='APT::Install-Recommends "false"'
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/* "$1"/var/log/*')
  sources=("deb $mirror $release main" "deb $mirror $release-updates main"
    "deb ${DEBIAN_SECURITY_MIRROR:-${mirror%/debian}/debian-security} $release-security main")
  key=$(printf '%s\n' "${opts[@]}" "${sources[@]}" | sha256sum | cut -c1-16)
  base=localhost/felixrs-base:$release-$key
  tarball=target/image-base/$release-$key.tar
  mkdir -p target/image-base
  if [ -z "$(find "$tarball" -type f -mtime -7 2>/dev/null)" ]; then
    # Network-bound: runs while cargo compiles.
    echo "==> mmdebstrap $release + $packages (in the background, log target/image-base/mmdebstrap.log)"
    rm -rf target/image-base/*.tar
    # (mmdebstrap picks its output format by the name's extension: keep .tar last.)
    (mmdebstrap --quiet "${opts[@]}" "$release" "${tarball%.tar}.tmp.tar" "${sources[@]}" \
      && mv "${tarball%.tar}.tmp.tar" "$tarball") >target/image-base/mmdebstrap.log 2>&1 &
    mmdebstrap_pid=$!
  fi
  build_args+=(--build-arg "BUILD_BASE=$base" --build-arg "RUNTIME_BASE=$base")
fi

echo "==> cargo build --release (felixrs, policy-controller)"
cargo build --release --locked -p felixrs -p policy-controller --bins
stage=target/image
mkdir -p "$stage"
for b in felixrs policy-controller; do
  # Line tables (profile.release debug = 1) stay in target/release for profiling, not in the image.
  objcopy --strip-debug "target/release/$b" "$stage/$b.tmp" && mv "$stage/$b.tmp" "$stage/$b"
done
python3 scripts/sbom.py "$stage/sbom.cdx.json"
build_args+=(--build-arg "FELIXRS_VERSION=$("$stage/felixrs" --version | sed 's/^felixrs //')"
  --build-arg "FELIXRS_GIT_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || true)"
  --build-arg "FELIXRS_VERSION_EXTRA=${FELIXRS_VERSION_EXTRA:-}")

if [ -n "$base" ]; then
  if [ -n "${mmdebstrap_pid:-}" ]; then
    wait "$mmdebstrap_pid" || { cat target/image-base/mmdebstrap.log >&2; echo "build-image: mmdebstrap failed" >&2; exit 1; }
  fi
  if [ -n "${mmdebstrap_pid:-}" ] || ! "$builder" image inspect "$base" >/dev/null 2>&1; then
    echo "==> importing $tarball as $base"
    "$builder" import --change 'CMD ["/bin/bash"]' "$tarball" "$base" >/dev/null
  fi
fi

echo "==> $builder building $image"
previous=$("$builder" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
case "$builder" in
  buildah) buildah bud --layers --network host -f Containerfile "${build_args[@]}" -t "$image" . ;;
  *) "$builder" build --network host -f Containerfile "${build_args[@]}" -t "$image" . ;;
esac

if [ "$builder" = buildah ]; then
  echo "build-image: $image built in $(($(date +%s) - start)) s (buildah runs no container: no smoke test)"
  exit 0
fi
# The image this tag named before (and its build cache layers) would only take disk space, unless
# another tag still names it.
current=$("$builder" image inspect --format '{{.Id}}' "$image")
if [ -n "$previous" ] && [ "$previous" != "$current" ] \
  && [ "$("$builder" image inspect --format '{{len .RepoTags}}' "$previous" 2>/dev/null)" = 0 ]; then
  "$builder" rmi "$previous" >/dev/null 2>&1 || true
fi

echo "==> smoke test"
run=("$builder" run --rm --read-only --network none)
"${run[@]}" "$image" --version
"${run[@]}" --entrypoint /usr/local/bin/policy-controller "$image" --version
size=$("$builder" image inspect --format '{{.Size}}' "$image")
echo "build-image: $image, $((size / 1000000)) MB, built in $(($(date +%s) - start)) s"
