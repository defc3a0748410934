# adopt-lv.md, "Credentials": the operator's client certificate, issued by
# the security owner from the CA the install guide made (the guide leaves
# how to them): clientAuth, into ~/.pillar-agent-client beside ca.crt.
set -euo pipefail
umask 077
dir=$HOME/.pillar-agent-client
mkdir -p "$dir"
printf '%s\n' 'extendedKeyUsage=clientAuth' 'keyUsage=critical,digitalSignature' 'basicConstraints=CA:FALSE' > "$dir/client.ext"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=operator-alice \
  -keyout "$dir/client.key" -out "$dir/client.csr" 2>/dev/null
openssl x509 -req -in "$dir/client.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
  -extfile "$dir/client.ext" -out "$dir/client.crt" 2>/dev/null
rm "$dir/client.csr" "$dir/client.ext"
