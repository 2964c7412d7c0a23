#!/usr/bin/env bash
# A local fleet: N `petstore serve` replicas of one build on loopback ports,
# sharing one Redis and (when reachable) one PostgreSQL, behind HAProxy
# checking each replica's /readyz; optionally Prometheus scraping them with
# the project's alert rules. Every process it starts is tracked by a PID
# file in the state directory, and only those are ever stopped.
#
#   cluster.sh up         start what is not running (safe to repeat)
#   cluster.sh down       stop exactly what `up` started
#   cluster.sh status     what runs, and the URLs and keys
#   cluster.sh loadtest   reset the keys' limits and run the load-test kit
#
# Settings (environment): REPLICAS (3), PORT (18080: HAProxy; replicas use
# PORT+1.. for the API and PORT+1001.. for ops), PROMETHEUS=1 (Prometheus
# on PORT+1090), PETSTORE_BIN (bin/petstore), CLUSTER_DIR (.cluster),
# CLUSTER_REDIS_URL (redis://127.0.0.1:6379/2 when that Redis answers,
# else a private redis-server), CLUSTER_DATABASE_URL (database
# petstore_cluster on 127.0.0.1:5432 when it answers, else pets in memory
# and keys in a static keys file), BALANCE (roundrobin; key: each API key
# to one replica, by a consistent hash of its Authorization header, so that
# a replica sees all of a key's traffic and its leases and reservations
# are as large as one replica's; key-bounded: the same, but a replica
# holding 1.5 times the fleet's average of requests in flight passes the
# excess on; see docs/rate-limiting.md, "Key affinity"), FINALIZE (1: once the
# replicas are up, `petstore limits finalize --optional`, as the Helm
# chart runs after a fresh install, so blocks are in force; 0 leaves the
# fleet unfinalized, to try a rollout from there). Nothing
# listens beyond 127.0.0.1; no root is needed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
REPLICAS=${REPLICAS:-3}
PORT=${PORT:-18080}
STATE=${CLUSTER_DIR:-$ROOT/.cluster}
BIN=${PETSTORE_BIN:-$ROOT/bin/petstore}
PROMETHEUS=${PROMETHEUS:-0}
BALANCE=${BALANCE:-roundrobin}
LOADTEST_KEYS=${LOADTEST_KEYS:-20}
FINALIZE=${FINALIZE:-1}

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

api_port() { echo $((PORT + $1)); }
ops_port() { echo $((PORT + 1000 + $1)); }
prom_port() { echo $((PORT + 1090)); }
redis_port() { echo $((PORT + 1079)); }

# alive NAME: the process of NAME's PID file runs, and is still the one we
# started (its command line mentions the state directory; redis-server
# rewrites its own, so for it the private port), so a recycled PID is
# never signalled.
alive() {
  local pidfile="$STATE/$1.pid" pid mark="$STATE"
  [ "$1" = redis ] && mark="127.0.0.1:$(redis_port)"
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$mark"
}

# spawn NAME CMD...: start CMD in the background, log and PID in $STATE.
spawn() {
  local name=$1; shift
  nohup "$@" >>"$STATE/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/$name.pid"
}

stop() {
  local name=$1 pid
  if ! alive "$name"; then
    rm -f "$STATE/$name.pid"
    return
  fi
  pid=$(cat "$STATE/$name.pid")
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    [ -d "/proc/$pid" ] || break
    sleep 0.1
  done
  if [ -d "/proc/$pid" ]; then
    log "$name did not stop within 10s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$STATE/$name.pid"
}

wait_http() {
  local url=$1 what=$2
  for _ in $(seq 1 100); do
    curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  die "$what did not answer on $url; see $STATE/*.log"
}

need() {
  command -v "$1" >/dev/null && return
  die "$1 is not installed: $2"
}

redis_url() {
  if [ -n "${CLUSTER_REDIS_URL:-}" ]; then
    echo "$CLUSTER_REDIS_URL"
  elif [ -f "$STATE/redis-url" ]; then
    cat "$STATE/redis-url"
  elif port_open 6379; then
    # The machine's Redis, in a database of its own.
    echo redis://127.0.0.1:6379/2 | tee "$STATE/redis-url"
  else
    echo "redis://127.0.0.1:$(redis_port)/0" | tee "$STATE/redis-url"
  fi
}

database_url() {
  if [ -n "${CLUSTER_DATABASE_URL:-}" ]; then
    echo "$CLUSTER_DATABASE_URL"
  elif [ -f "$STATE/database-url" ]; then
    cat "$STATE/database-url"
  elif port_open 5432 && command -v psql >/dev/null &&
    psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1; then
    if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "select 1 from pg_database where datname='petstore_cluster'")" != 1 ]; then
      psql -h 127.0.0.1 -U postgres -d postgres -qc 'create database petstore_cluster' >/dev/null
    fi
    echo 'postgres://postgres@127.0.0.1:5432/petstore_cluster?sslmode=disable' | tee "$STATE/database-url"
  else
    : >"$STATE/database-url"
  fi
}

# petstore CMD...: an admin command against the cluster's Redis, database,
# plans and keys.
petstore() {
  PETSTORE_REDIS_URL=$(redis_url) PETSTORE_DATABASE_URL=$(database_url) \
    PETSTORE_PLANS_FILE="$STATE/plans.yaml" PETSTORE_KEYS_FILE="$STATE/keys.yaml" "$BIN" "$@"
}

write_plans() {
  # tiny: a few requests per few seconds, to watch 429s and bans by hand.
  cat >"$STATE/plans.yaml" <<'EOF'
plans:
  tiny:
    quotas: [{limit: 5, period: 10s}]
    ban: {threshold: 10, within: 1m, duration: 30s, multiplier: 2, max: 10m, memory: 1h}
EOF
}

# make_keys: keys on the loadtest plan and on tiny, made once per state
# directory (a key is shown only when it is created). With a database they
# are stored there; without, they are only generated and listed in the
# static keys file.
make_keys() {
  [ -s "$STATE/keys-loadtest.csv" ] && [ -s "$STATE/keys-tiny.csv" ] && return
  : >"$STATE/keys.yaml"
  petstore keys create --plan loadtest --count "$LOADTEST_KEYS" --format csv --label cluster-loadtest >"$STATE/keys-loadtest.csv.tmp"
  petstore keys create --plan tiny --count 3 --format csv --label cluster-tiny >"$STATE/keys-tiny.csv.tmp"
  mv "$STATE/keys-loadtest.csv.tmp" "$STATE/keys-loadtest.csv"
  mv "$STATE/keys-tiny.csv.tmp" "$STATE/keys-tiny.csv"
  if [ -z "$(database_url)" ]; then
    {
      echo "keys:"
      tail -q -n +2 "$STATE/keys-loadtest.csv" "$STATE/keys-tiny.csv" |
        while IFS=, read -r _ key plan label; do echo "  - {key: $key, plan: $plan, label: $label}"; done
    } >"$STATE/keys.yaml"
  fi
}

# balance_lines: HAProxy's balancing for BALANCE.
balance_lines() {
  case "$BALANCE" in
    roundrobin) echo '  balance roundrobin' ;;
    # The bearer key is the whole header; requests without one (the
    # OpenAPI document) fall back to round robin.
    key) printf '  balance hdr(Authorization)\n  hash-type consistent\n' ;;
    # By key, but no replica holds more than 1.5 times the fleet's average
    # of requests in flight: a hot key's excess goes on to the next
    # replicas on the ring (consistent hashing with bounded loads).
    key-bounded) printf '  balance hdr(Authorization)\n  hash-type consistent\n  hash-balance-factor 150\n' ;;
    *) die "BALANCE=$BALANCE: want roundrobin, key or key-bounded" ;;
  esac
}

write_haproxy_config() {
  # The same balancing and checks as the fleet system tests
  # (internal/fleettest): round robin (or by key), /readyz on each replica's ops port
  # every 300 ms, out after one failed check, and a failed connection or
  # an empty answer retried once on another replica.
  {
    cat <<EOF
global
  maxconn 4096
  stats socket $STATE/haproxy.sock mode 600 level admin

defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  retries 2
  option redispatch 1
  retry-on conn-failure empty-response

frontend api
  bind 127.0.0.1:$PORT
  default_backend replicas

backend replicas
$(balance_lines)
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 300ms fall 1 rise 1
  # Which replica answered, for the load-test kit's failure messages.
  http-response set-header X-Served-By %[srv_name]
EOF
    for i in $(seq 1 "$REPLICAS"); do
      echo "  server r$i 127.0.0.1:$(api_port "$i") check port $(ops_port "$i")"
    done
  } >"$STATE/haproxy.cfg"
}

write_prometheus_config() {
  {
    cat <<EOF
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $ROOT/deploy/prometheus/alerts.yaml
scrape_configs:
  - job_name: petstore
    static_configs:
      - targets:
EOF
    for i in $(seq 1 "$REPLICAS"); do
      echo "          - 127.0.0.1:$(ops_port "$i")"
    done
  } >"$STATE/prometheus.yml"
}

up() {
  [ -x "$BIN" ] || die "no petstore binary at $BIN: run make build (make cluster does)"
  balance_lines >/dev/null # an unknown BALANCE stops here, before anything starts
  need haproxy "install Debian's haproxy package (as root: make services, or apt-get install haproxy)"
  need curl "install curl"
  if [ "$PROMETHEUS" = 1 ]; then
    need prometheus "install Debian's prometheus package (as root: apt-get install prometheus), or leave PROMETHEUS unset"
  fi
  mkdir -p "$STATE"
  for i in $(seq 1 "$REPLICAS"); do
    for p in "$(api_port "$i")" "$(ops_port "$i")"; do
      if ! alive "replica-$i" && port_open "$p"; then
        die "port $p is taken by another program: choose another PORT"
      fi
    done
  done

  local redis db
  redis=$(redis_url)
  if [[ $redis == "redis://127.0.0.1:$(redis_port)/0" ]] && ! alive redis; then
    need redis-server "install Debian's redis-server package, or run Redis on 127.0.0.1:6379"
    log "starting a private redis-server on 127.0.0.1:$(redis_port)"
    spawn redis redis-server --bind 127.0.0.1 --port "$(redis_port)" --save "" --appendonly no --dir "$STATE"
    for _ in $(seq 1 50); do port_open "$(redis_port)" && break; sleep 0.1; done
  fi
  db=$(database_url)
  if [ -n "$db" ]; then
    petstore migrate >/dev/null
  else
    log "no PostgreSQL on 127.0.0.1:5432 (or no psql): pets in memory, keys in $STATE/keys.yaml"
  fi
  write_plans
  make_keys

  local store=memory
  [ -n "$db" ] && store=postgres
  for i in $(seq 1 "$REPLICAS"); do
    alive "replica-$i" && continue
    log "starting replica r$i: API 127.0.0.1:$(api_port "$i"), ops 127.0.0.1:$(ops_port "$i")"
    # The state directory is in every command line: alive() recognises
    # our processes by it. Every client of this fleet (curl, the load-test
    # kit, HAProxy's own address) is 127.0.0.1, and a database key's
    # lookup is charged to its client address's throttle (each replica
    # looks a key up again after --key-cache-ttl): the default 30/min
    # would refuse the load test's keys, so loopback gets room for them.
    spawn "replica-$i" env PETSTORE_REDIS_URL="$redis" PETSTORE_DATABASE_URL="$db" \
      "$BIN" serve --addr "127.0.0.1:$(api_port "$i")" --ops-addr "127.0.0.1:$(ops_port "$i")" \
      --store "$store" --ratelimit-replicas "$REPLICAS" --auth-failure-limit 10000/1m \
      --plans-file "$STATE/plans.yaml" --keys-file "$STATE/keys.yaml" \
      --reload-interval 2s --drain-delay 1s --trusted-proxies 127.0.0.1 --log-level warn
  done
  for i in $(seq 1 "$REPLICAS"); do
    wait_http "http://127.0.0.1:$(ops_port "$i")/readyz" "replica r$i"
  done

  if ! alive haproxy; then
    write_haproxy_config
    log "starting haproxy on 127.0.0.1:$PORT"
    spawn haproxy haproxy -db -f "$STATE/haproxy.cfg"
  fi
  wait_http "http://127.0.0.1:$PORT/openapi.yaml" haproxy
  if [ "$FINALIZE" = 1 ]; then
    # As the chart's install hook: never fails the start (a replica of an
    # older build still running is reported, and the fleet stays as it is).
    log "$(petstore limits finalize --wait 10s --optional)"
  fi

  if [ "$PROMETHEUS" = 1 ] && ! alive prometheus; then
    write_prometheus_config
    log "starting prometheus on 127.0.0.1:$(prom_port)"
    spawn prometheus prometheus --config.file="$STATE/prometheus.yml" --storage.tsdb.path="$STATE/prometheus" \
      --web.listen-address="127.0.0.1:$(prom_port)"
    wait_http "http://127.0.0.1:$(prom_port)/-/ready" prometheus
  fi
  status
}

status() {
  local n=0
  for i in $(seq 1 "$REPLICAS"); do alive "replica-$i" && n=$((n + 1)); done
  if ! alive haproxy || [ "$n" -eq 0 ]; then
    echo "the cluster is not running (make cluster starts it)"
    return
  fi
  local lt tiny
  lt=$(sed -n 2p "$STATE/keys-loadtest.csv" | cut -d, -f2)
  tiny=$(sed -n 2p "$STATE/keys-tiny.csv" | cut -d, -f2)
  cat <<EOF

petstore fleet: $n of $REPLICAS replicas behind HAProxy (state in $STATE)

  load balancer   http://127.0.0.1:$PORT (balance $(sed -n 's/^  balance //p' "$STATE/haproxy.cfg"))
EOF
  for i in $(seq 1 "$REPLICAS"); do
    printf '  replica r%d      API http://127.0.0.1:%d  ops http://127.0.0.1:%d/metrics\n' "$i" "$(api_port "$i")" "$(ops_port "$i")"
  done
  alive prometheus && echo "  prometheus      http://127.0.0.1:$(prom_port) (alert rules loaded)"
  cat <<EOF
  redis           $(redis_url)
  postgres        $(db=$(database_url); echo "${db:-none: pets in memory, keys in $STATE/keys.yaml}")

Keys ($STATE/keys-*.csv: id,key,plan,label):
  loadtest plan (1000/s per key): $(($(wc -l <"$STATE/keys-loadtest.csv") - 1)) keys, e.g. $lt
  tiny plan (5 per 10s, banned for 30s after 10 refusals in 1m): $tiny

Watch 429s, then a ban:
  for i in \$(seq 20); do curl -s -o /dev/null -w '%{http_code} ' -H 'Authorization: Bearer $tiny' http://127.0.0.1:$PORT/v1/pets; done; echo
  curl -si -H 'Authorization: Bearer $tiny' http://127.0.0.1:$PORT/v1/pets | grep -iE '^(HTTP|Retry-After|X-RateLimit)|code'

Load test: make loadtest    Stop: make cluster-down
EOF
}

down() {
  [ -d "$STATE" ] || { log "nothing to stop"; return; }
  stop prometheus
  stop haproxy
  for f in "$STATE"/replica-*.pid; do
    [ -e "$f" ] || continue
    stop "$(basename "$f" .pid)"
  done
  stop redis
  log "stopped; keys and logs stay in $STATE (delete it to start afresh)"
}

loadtest() {
  alive haproxy || die "the cluster is not running: make cluster first"
  log "building the load-test kit"
  (cd "$ROOT/deploy/loadtest" && go build -o "$STATE/loadtest" .)
  log "$(petstore limits reset --plan loadtest)"
  log "$(petstore limits reset --plan tiny)"
  # Every answer counts down from a count Redis made, and the replicas
  # lease admissions (64 at most a lease or a block: --ratelimit-max-lease's
  # default), so one key's Remaining may rise between answers by what the
  # fleet has counted and not spent (per replica a lease or block held, a
  # lease and a block in flight, a give-back on its way: twice
  # -remaining-held) and by what the key sent over a block's life (10 s):
  # the kit allows that, 2 x 384 + rate*10s/keys + burst/keys = 1,318 for
  # three replicas, and no more (deploy/loadtest/README.md, "The Remaining
  # allowance"). The steady load ramps up over its first 5 s, so replicas
  # just started open their connections as traffic grows.
  "$STATE/loadtest" -url "http://127.0.0.1:$PORT" -keys "$STATE/keys-loadtest.csv" -tiny-keys "$STATE/keys-tiny.csv" \
    -tiny-limit 5 -tiny-period 10s -tiny-ban 30s -ramp 5s \
    -remaining-held $((REPLICAS * 2 * 64)) -remaining-lease-life 10s "$@"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  loadtest) shift; loadtest "$@" ;;
  balance) balance_lines ;; # HAProxy's balancing for BALANCE (the fleet tests compare theirs)
  *) die "usage: $0 up|down|status|loadtest [kit flags]|balance" ;;
esac
