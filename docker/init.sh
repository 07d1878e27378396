#!/usr/bin/env bash
# pgdispatch-init: the compose stack's one-shot start-up job. Waits for the database, installs
# the schema (`pgdispatch install`: only what is missing, and the pg_cron jobs where pg_cron
# lives in this database), then adds the demo schedules once when PGDISPATCH_DEMO_SCHEDULES=1.
#
#   PGDISPATCH_DATABASE_URL=postgresql://... pgdispatch-init
set -euo pipefail

: "${PGDISPATCH_DATABASE_URL:?set PGDISPATCH_DATABASE_URL}"
pgdispatch=${PGDISPATCH:-pgdispatch}
wait_s=${PGDISPATCH_INIT_WAIT:-60}

deadline=$((SECONDS + wait_s))
until out=$("$pgdispatch" install 2>&1); do
  if [[ $out != *"cannot connect"* ]] || ((SECONDS >= deadline)); then
    echo "$out" >&2
    echo "pgdispatch-init: install failed" >&2
    exit 1
  fi
  sleep 1
done
echo "$out"

if [[ ${PGDISPATCH_DEMO_SCHEDULES:-0} == 1 ]]; then
  if [[ $("$pgdispatch" schedules list --project demo --json) == "[]" ]]; then
    "$pgdispatch" schedules add --project demo --function send-report --cron '* * * * *' \
      --args '{"to": "team@example.com"}' >/dev/null
    "$pgdispatch" schedules add --project demo --function always-fails --cron '* * * * *' >/dev/null
    "$pgdispatch" schedules add --project demo --function weekly-digest --cron '0 9 * * MON' \
      --timezone Europe/Berlin --args '{"week": "current"}' >/dev/null
    echo "pgdispatch-init: added the demo schedules"
  fi
  "$pgdispatch" schedules list --project demo
fi
