# PostgreSQL 15 with pg_cron, configured for pgdispatch: pg_cron preloaded, its jobs in the
# database POSTGRES_DB names (cron.database_name), so `pgdispatch install` registers
# dispatch-tick there itself. Build context: docker/.
FROM postgres:15

RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15-cron \
    && rm -rf /var/lib/apt/lists/*

# Runs once, when the entrypoint initialises an empty data directory; the server it starts
# afterwards loads pg_cron.
COPY postgres/10-pg-cron.sh /docker-entrypoint-initdb.d/10-pg-cron.sh
