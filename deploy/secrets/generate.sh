#!/usr/bin/env sh
# The secrets deploy/compose.yaml mounts: random passwords for the PostgreSQL superuser, the service
# role and the capture role, the DSNs that use them, and an admin API key. Files that exist are
# kept (the database volume already holds those passwords): delete one to make it again.
#
#   deploy/secrets/generate.sh        # then: docker compose -f deploy/compose.yaml up -d --build
#   cat deploy/secrets/api_key        # the key for `Authorization: Bearer …`
set -eu
cd "$(dirname "$0")"
chmod 700 .  # the files are readable by the containers' users; the directory keeps them from other local users
umask 022
random() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
put() {  # put NAME CONTENT: write it unless it exists
  if [ ! -e "$1" ]; then printf '%s\n' "$2" > "$1.tmp" && mv "$1.tmp" "$1"; fi
}
put postgres_password "$(random)"
put service_password "$(random)"
put capture_password "$(random)"
put api_key "$(random)"
put service_dsn "postgresql://tributary_service:$(cat service_password)@postgres:5432/tributary"
put sources.json "[{\"name\": \"shop\", \"dsn\": \"postgresql://tributary_capture:$(cat capture_password)@postgres:5432/shop\"}]"
put api_keys.json "[{\"key\": \"$(cat api_key)\", \"scopes\": [\"admin\"]}]"
echo "secrets in $(pwd)"
