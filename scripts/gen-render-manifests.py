#!/usr/bin/env python3
"""Writes a deterministic large manifest set for timing `felixrs render` (one file per kind).

Usage: scripts/gen-render-manifests.py [--yaml] DIR [PODS] [POLICIES]   (defaults: 5000 pods, 500
policies; documents are one-line JSON, or block-style YAML as kubectl writes it with --yaml)
Then:  hyperfine 'target/release/felixrs render --manifests DIR --node-name node-0'

Shape (the controller bench's, `policy-controller/benches/sync.rs`, scaled): 100 namespaces, pods
spread over 50 nodes and 20 apps with a named port, NetworkPolicies with pod, namespace and ipBlock
peers and numbered, named and UDP ports.
"""
import json
import os
import re
import sys

args = sys.argv[1:]
yaml = "--yaml" in args
args = [a for a in args if a != "--yaml"]
out = args[0]
pods = int(args[1]) if len(args) > 1 else 5000
policies = int(args[2]) if len(args) > 2 else 500
os.makedirs(out, exist_ok=True)

PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*")
RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "y", "n"}


def scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if PLAIN.fullmatch(v) and v.lower() not in RESERVED:
        return v
    return json.dumps(v)


def to_yaml(v, indent=""):
    """Block-style YAML lines of a dict/list of str/int, as kubectl prints manifests."""
    lines = []
    if isinstance(v, dict):
        if not v:
            return ["{}"]
        for k, x in v.items():
            if isinstance(x, (dict, list)) and x:
                lines.append(f"{indent}{k}:")
                lines.extend(to_yaml(x, indent + "  "))
            else:
                lines.append(f"{indent}{k}: {to_yaml(x)[0] if isinstance(x, (dict, list)) else scalar(x)}")
    elif isinstance(v, list):
        if not v:
            return ["[]"]
        for x in v:
            if isinstance(x, (dict, list)) and x:
                sub = to_yaml(x, indent + "  ")
                lines.append(f"{indent}- {sub[0][len(indent) + 2:]}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{indent}- {to_yaml(x)[0] if isinstance(x, (dict, list)) else scalar(x)}")
    return lines


def write(name, docs):
    with open(os.path.join(out, name), "w") as f:
        if yaml:
            f.write("\n---\n".join("\n".join(to_yaml(d)) for d in docs))
        else:
            f.write("\n---\n".join(json.dumps(d, separators=(",", ":")) for d in docs))
        f.write("\n")


write("namespaces.yaml", [
    {"apiVersion": "v1", "kind": "Namespace",
     "metadata": {"name": f"ns-{i}", "labels": {"team": "a" if i % 2 == 0 else "b"}}}
    for i in range(100)])
write("pods.yaml", [
    {"apiVersion": "v1", "kind": "Pod",
     "metadata": {"name": f"web-{i}", "namespace": f"ns-{i % 100}",
                  "labels": {"app": f"app-{i % 20}", "tier": "web"}},
     "spec": {"nodeName": f"node-{i % 50}",
              "containers": [{"name": "c", "image": "x",
                              "ports": [{"name": "http", "containerPort": 8080}]}]},
     "status": {"phase": "Running",
                "podIP": f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}"}}
    for i in range(pods)])
write("policies.yaml", [
    {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
     "metadata": {"name": f"np-{i}", "namespace": f"ns-{i % 100}"},
     "spec": {"podSelector": {"matchLabels": {"app": f"app-{i % 20}"}},
              "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "web"}}},
                                    {"namespaceSelector": {"matchLabels": {"team": "a"}}},
                                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                           "ports": [{"port": 80}, {"port": 81}, {"port": "http"},
                                     {"port": 53, "protocol": "UDP"}]}],
              "egress": [{"to": [{"podSelector": {}}]}]}}
    for i in range(policies)])
