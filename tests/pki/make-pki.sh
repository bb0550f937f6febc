#!/usr/bin/env bash
# Test PKI, made fresh at test time (nothing committed, so nothing expires): into DIR,
#   ca.pem, ca-key.pem              a CA ("kvrouter test CA")
#   server.pem, server-key.pem      a server certificate for 127.0.0.1 (IP SAN) and localhost
#   client.pem, client-key.pem      a client certificate (extendedKeyUsage clientAuth)
#   other-ca.pem, other-ca-key.pem  an unrelated CA (a client that trusts it must refuse the server)
# EC P-256 keys, valid for 2 days. Needs the openssl CLI (scripts/deps.sh installs it).
#   bash tests/pki/make-pki.sh DIR
set -euo pipefail
dir=${1:?usage: make-pki.sh DIR}
command -v openssl >/dev/null || { echo "make-pki: openssl not found (bash scripts/deps.sh)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
umask 077

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# ca NAME CN: a self-signed CA
ca() {
  key "$1-key.pem"
  openssl req -x509 -new -key "$1-key.pem" -sha256 -days 2 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1.pem" 2>/dev/null
}

# leaf NAME CN EXTFILE-TEXT: a certificate signed by ca.pem
leaf() {
  key "$1-key.pem"
  openssl req -new -key "$1-key.pem" -subj "/CN=$2" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -sha256 -days 2 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca "kvrouter test CA"
ca other-ca "some other CA"
leaf server "127.0.0.1" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
leaf client "kvrouter-test-client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
rm -f ca.srl
openssl verify -CAfile ca.pem server.pem client.pem >/dev/null
