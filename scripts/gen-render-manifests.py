#!/usr/bin/env python3
"""Writes a deterministic large manifest set for timing `felixrs render` (one file per kind).

Usage: scripts/gen-render-manifests.py DIR [PODS] [POLICIES]   (defaults: 5000 pods, 500 policies)
Then:  hyperfine 'target/release/felixrs render --manifests DIR --node-name node-0'

Shape (the controller bench's, `policy-controller/benches/sync.rs`, scaled): 100 namespaces, pods
spread over 50 nodes and 20 apps with a named port, NetworkPolicies with pod, namespace and ipBlock
peers and numbered, named and UDP ports.
"""
import json
import os
import sys

out = sys.argv[1]
pods = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
policies = int(sys.argv[3]) if len(sys.argv) > 3 else 500
os.makedirs(out, exist_ok=True)


def write(name, docs):
    with open(os.path.join(out, name), "w") as f:
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
