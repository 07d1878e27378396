#!/usr/bin/env bash
# pg_cron for pgdispatch, in a data directory the official postgres image initialises: preload
# it and keep its jobs in the application database (POSTGRES_DB), where `pgdispatch install`
# then registers dispatch-tick and dispatch-prune. The image's entrypoint runs this once, with
# PGDATA set, before the server that serves clients starts; running it again changes nothing.
set -euo pipefail

conf="${PGDATA:?PGDATA is not set}/postgresql.conf"
database="${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"

if ! grep -q '^# pgdispatch: pg_cron' "$conf"; then
  cat >>"$conf" <<CONF

# pgdispatch: pg_cron, with its jobs in the application database
shared_preload_libraries = 'pg_cron'
cron.database_name = '${database}'
CONF
  echo "10-pg-cron.sh: pg_cron preloaded, its jobs in database ${database}"
fi
