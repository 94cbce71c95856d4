#!/usr/bin/env bash
# Offline checks of what ships, without a cluster or a container builder:
#   * hadolint lints the Containerfile;
#   * `kubectl kustomize` renders deploy/base and every overlay (with a test PKI made by
#     scripts/etcd-certs.sh in a scratch copy), every image is felixrs/felixrs:<workspace version>
#     or pinned by tag;
#   * every rendered object passes strict schema validation (unknown fields are errors) against
#     the Kubernetes OpenAPI schemas of pinned versions (kubernetes-validate ships them);
#   * negative controls: the validator rejects a broken object, and an overlay without its PEM
#     files does not render.
# The tools are pinned in scripts/ci-tools.txt and installed into a venv once (needs PyPI then).
#
# Usage: scripts/check-ship.sh      last line: "checks: N passed, M failed"
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
k8s_versions=(1.30.0 1.34.0)
venv=${FELIXRS_TOOLS_VENV:-$root/target/ci-tools/venv}
py=$(command -v /usr/bin/python3 || command -v python3)

if ! cmp -s scripts/ci-tools.txt "$venv/.pins" 2>/dev/null; then
  echo "==> installing $(grep -v '^#' scripts/ci-tools.txt | tr '\n' ' ')into $venv"
  rm -rf "$venv"
  "$py" -m venv "$venv" \
    && "$venv/bin/pip" install -q --disable-pip-version-check -r scripts/ci-tools.txt \
    && cp scripts/ci-tools.txt "$venv/.pins" \
    || { echo "check-ship: cannot install the tools in scripts/ci-tools.txt" >&2; echo "checks: 0 passed, 1 failed"; exit 1; }
fi
bin=$venv/bin
passed=0
failed=0
check() { # name command...
  local name=$1
  shift
  local out
  if out=$("$@" 2>&1); then
    passed=$((passed + 1))
    echo "check $name ... ok"
  else
    failed=$((failed + 1))
    echo "check $name ... FAILED"
    printf '%s\n' "$out" | sed 's/^/    /'
  fi
}
fails() { ! "$@"; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)

check "hadolint Containerfile" "$bin/hadolint" --failure-threshold info Containerfile

cp -r deploy "$scratch/deploy"
scripts/etcd-certs.sh "$scratch/pki" >/dev/null
for o in etcd-tls calico-free; do
  cp "$scratch"/pki/*.crt "$scratch"/pki/*.key "$scratch/deploy/overlays/$o/certs/"
done
# The committed overlays carry no keys: rendering one without them must fail.
check "overlay without PEM files does not render" fails "$bin/kubectl" kustomize deploy/overlays/etcd-tls

images_pinned() { # rendered.yaml
  local bad
  bad=$(grep -E '^\s+image:' "$1" | sed 's/.*image: *//' \
    | grep -vx "felixrs/felixrs:$version" | grep -vE '^[a-z0-9./-]+:[0-9][A-Za-z0-9._-]*$' || true)
  [ -z "$bad" ] || { echo "unpinned or unexpected images: $bad"; return 1; }
  grep -q "image: felixrs/felixrs:$version" "$1" || { echo "no felixrs/felixrs:$version"; return 1; }
}
validate() { # file version
  "$bin/kubernetes-validate" --strict --quiet -k "$2" "$1"
}

for k in base overlays/etcd-tls overlays/calico-free; do
  out="$scratch/$(echo "$k" | tr / _).yaml"
  check "kustomize $k" sh -c '"$1" kustomize "$2" > "$3" && test -s "$3"' _ "$bin/kubectl" "$scratch/deploy/$k" "$out"
  check "images of $k" images_pinned "$out"
  for v in "${k8s_versions[@]}"; do
    check "schema $k (Kubernetes $v, strict)" validate "$out" "$v"
  done
done

cat > "$scratch/broken.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  replica: 2
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec: {containers: [{name: c, image: x:1}]}
YAML
check "validator rejects an unknown field" fails validate "$scratch/broken.yaml" "${k8s_versions[0]}"

echo "checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
