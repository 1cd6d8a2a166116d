# ops/lib.sh: shared helpers of the ops scripts (sourced, not run).
# Installs what is missing with apt-get, and says so; never touches the
# machine's own Redis on 6379.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.ops-state"
CLUSTER_PORTS=(7001 7002 7003 7004 7005 7006)
LOCK_PORTS=(7101 7102 7103)

say() { echo "ops: $*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

APT_UPDATED=0
apt_install() {
  say "installing $* (missing on this machine)"
  if [ "$APT_UPDATED" = 0 ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    APT_UPDATED=1
  fi
  # policy-rc.d 101: packages must not start their own daemons (a packaged
  # redis-server or prometheus would take ports we do not own).
  local policy=/usr/sbin/policy-rc.d created=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod +x "$policy"
    created=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  if [ "$created" = 1 ]; then as_root rm -f "$policy"; fi
}

# Redis binaries, the PostgreSQL client, and a running PostgreSQL server.
ensure_deps() {
  command -v redis-server >/dev/null || apt_install redis-server
  command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || apt_install redis-tools
  command -v psql >/dev/null || apt_install postgresql-client
  # setcap, for the lock exec test of a file-capability command.
  command -v setcap >/dev/null || apt_install libcap2-bin
  # Prometheus and promtool, for the monitoring tests and ops/prometheus.yml.
  command -v prometheus >/dev/null && command -v promtool >/dev/null || apt_install prometheus
  # wrk, the HTTP load generator of the bench's `http` row (serve as an
  # operator drives it).
  command -v wrk >/dev/null || apt_install wrk
  # The TLS tests make their CA and certificates with it.
  command -v openssl >/dev/null || apt_install openssl
  # valgrind, whose callgrind counts instructions per purchase (bench/cost).
  command -v valgrind >/dev/null || apt_install valgrind
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    if ! command -v pg_ctlcluster >/dev/null; then
      apt_install postgresql
    fi
    local ver
    ver="$(ls /etc/postgresql | sort -V | tail -1)"
    say "starting PostgreSQL $ver"
    as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
    pg_isready -q -h 127.0.0.1 -p 5432 || { say "PostgreSQL does not answer on 127.0.0.1:5432"; exit 1; }
  fi
  if ! psql -h 127.0.0.1 -U postgres -d postgres -qAtc "select 1 from pg_database where datname='flashsale'" | grep -q 1; then
    say "creating database flashsale"
    psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE flashsale" >/dev/null
  fi
}

# schemathesis (PyPI), for the test that holds the live `serve` to its
# OpenAPI description: in a virtual environment of the project's own, at a
# pinned version, so a new release cannot change what the suite checks.
SCHEMATHESIS_VERSION=4.32.5
ensure_schemathesis() {
  local venv="$ROOT/target/schemathesis-venv"
  if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
    say "installing schemathesis $SCHEMATHESIS_VERSION into $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION"
  fi
  export FLASHSALE_SCHEMATHESIS="$venv/bin/schemathesis"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
