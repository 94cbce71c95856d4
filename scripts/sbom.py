#!/usr/bin/env python3
"""CycloneDX 1.5 JSON of the Rust crates compiled into the shipped binaries.

Walks `cargo metadata`'s resolved graph from the `felixrs` and `policy-controller` packages through
normal dependencies on the build's target platform (proc-macros included: the code they generate is
compiled in; dev- and build-dependencies left out: nothing of theirs ships), with each crate's
SHA-256 from Cargo.lock. A small script instead of cargo-cyclonedx: nothing to compile in CI.

Usage: scripts/sbom.py OUT.json      (from the workspace root; needs cargo and Python >= 3.11)
"""

import json
import subprocess
import sys
import tomllib
import uuid
from datetime import datetime, timezone

ROOTS = ("felixrs", "policy-controller")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    host = subprocess.run(
        ["rustc", "-vV"], check=True, capture_output=True, text=True
    ).stdout
    target = next(l.split(": ", 1)[1] for l in host.splitlines() if l.startswith("host: "))
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--locked", "--format-version", "1", "--filter-platform", target],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    with open("Cargo.lock", "rb") as f:
        lock = tomllib.load(f)
    sums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    roots = [i for i, p in packages.items() if p["name"] in ROOTS and i in meta["workspace_members"]]
    if len(roots) != len(ROOTS):
        print(f"sbom: expected workspace packages {ROOTS}, found {len(roots)}", file=sys.stderr)
        return 1
    seen, todo = set(), list(roots)
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        for d in nodes[i]["deps"]:
            if any(k["kind"] is None for k in d["dep_kinds"]):
                todo.append(d["pkg"])

    def ref(p):
        return f"pkg:cargo/{p['name']}@{p['version']}"

    components = []
    for i in sorted(seen, key=lambda i: (packages[i]["name"], packages[i]["version"])):
        p = packages[i]
        c = {"type": "library", "bom-ref": ref(p), "name": p["name"], "version": p["version"], "purl": ref(p)}
        if p.get("license"):
            c["licenses"] = [{"expression": p["license"]}]
        if i in meta["workspace_members"]:
            c["type"] = "application" if p["name"] in ROOTS else "library"
        elif sums.get((p["name"], p["version"])):
            c["hashes"] = [{"alg": "SHA-256", "content": sums[(p["name"], p["version"])]}]
        if p.get("repository"):
            c["externalReferences"] = [{"type": "vcs", "url": p["repository"]}]
        components.append(c)
    deps = [
        {
            "ref": ref(packages[i]),
            "dependsOn": sorted(
                {
                    ref(packages[d["pkg"]])
                    for d in nodes[i]["deps"]
                    if any(k["kind"] is None for k in d["dep_kinds"])
                }
            ),
        }
        for i in sorted(seen)
    ]
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "scripts/sbom.py"}]},
            "component": {"type": "container", "name": "felixrs/felixrs"},
        },
        "components": components,
        "dependencies": deps,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(bom, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"sbom: {len(components)} crates in {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
