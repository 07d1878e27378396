# The pgdispatch image: `pgdispatch listen` by default; also `pgdispatch install`,
# `pgdispatch doctor`, `pgdispatch demo-function` and pgdispatch-init (the compose stack's
# one-shot schema install). Build context: the repository root.
#   docker build -f docker/listener.Dockerfile -t pgdispatch .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# dispatcher/sql and dispatcher/pg-cluster are symlinks to ../sql and ../scripts/pg-cluster:
# copy their targets beside the package so that the build finds them.
WORKDIR /build
COPY pyproject.toml README.md ./
COPY sql ./sql
COPY scripts/pg-cluster ./scripts/pg-cluster
COPY dispatcher ./dispatcher
RUN pip install . && cd / && rm -rf /build

COPY docker/init.sh /usr/local/bin/pgdispatch-init

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin pgdispatch
USER 10001
WORKDIR /

# --metrics-port (see docker/compose.yaml)
EXPOSE 9464
ENTRYPOINT ["pgdispatch"]
CMD ["listen"]
