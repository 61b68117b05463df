#!/bin/sh
# Makes a CA and one certificate per member for axon's mutual TLS
# (docs/SECURITY.md), with the openssl command-line tool.
#
#   scripts/make_certs.sh DIR NAME[=HOST] ...
#
# DIR/ca.pem and DIR/ca.key: the CA (keep ca.key off the hosts). For each
# NAME: DIR/NAME.pem (subject CN = NAME, the member's --name) and
# DIR/NAME.key. The certificate also names NAME as a DNS subject
# alternative name, and HOST (an IP address or a host name) when given:
# a member that others dial by address before they know its name (the
# master: --master HOST:PORT) needs its HOST there. Existing CA files in
# DIR are reused, so members can be added later. Keys are ECDSA P-256,
# certificates valid for 825 days.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR NAME[=HOST] ..." >&2
  exit 2
fi
dir=$1
shift
mkdir -p "$dir"
umask 077
days=825
if [ ! -f "$dir/ca.pem" ] || [ ! -f "$dir/ca.key" ]; then
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" \
    -subj "/CN=axon CA $(hostname 2>/dev/null || echo local) $(date +%s)" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
for arg in "$@"; do
  name=${arg%%=*}
  host=
  [ "$name" != "$arg" ] && host=${arg#*=}
  case "$name" in
    '' | *[!A-Za-z0-9._-]*)
      echo "$0: bad member name '$name' (letters, digits, . _ -)" >&2
      exit 2 ;;
  esac
  san="DNS:$name"
  if [ -n "$host" ]; then
    case "$host" in
      *[!0-9.]*) case "$host" in *:*) san="$san,IP:$host" ;; *) san="$san,DNS:$host" ;; esac ;;
      *) san="$san,IP:$host" ;;
    esac
  fi
  ext=$(mktemp)
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' \
    "$san" > "$ext"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/$name.pem" -days "$days" -extfile "$ext" 2>/dev/null
  rm -f "$ext" "$dir/$name.csr"
  echo "$dir/$name.pem: CN=$name, $san"
done
chmod 644 "$dir"/*.pem
