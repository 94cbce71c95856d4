#!/usr/bin/env bash
# Makes a small etcd PKI for the deploy/ overlays with openssl: a CA, a server certificate for
# felixrs-etcd.felixrs-system.svc (the calico-free overlay's etcd) and a client certificate for
# the controller and the agents.
#
# Usage: scripts/etcd-certs.sh DIR     (writes DIR/{ca,server,client}.{crt,key}; keys mode 0600)
# For production use your own CA and keep the keys out of git (the certs/ dirs ignore them).
set -euo pipefail
dir=${1:?usage: scripts/etcd-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
umask 077
days=${DAYS:-825}
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
  -keyout ca.key -out ca.crt -subj "/CN=felixrs-etcd-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null
issue() { # name cn extensions
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
    -out "$1.crt" -extfile <(printf '%s\n' "$3") 2>/dev/null
  rm -f "$1.csr"
}
issue server felixrs-etcd "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:felixrs-etcd.felixrs-system.svc,DNS:felixrs-etcd.felixrs-system.svc.cluster.local,DNS:felixrs-etcd-0.felixrs-etcd.felixrs-system.svc,DNS:localhost,IP:127.0.0.1"
issue client felixrs "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
rm -f ca.srl
chmod 0644 ca.crt server.crt client.crt
echo "wrote $(pwd)/{ca,server,client}.{crt,key}"
