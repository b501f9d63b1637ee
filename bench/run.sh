#!/usr/bin/env bash
# The one benchmark command. Runs the peer libraries (this nested module) and
# the scheduler's claimers, raw references and scale scenario (the main
# module's cmd/scheduler-bench) against the same servers in one run, and
# prints one table. Results go to bench/out/ (results.json, claims.svg,
# table.txt).
#
#   bash bench/run.sh            full run, about 3-4 minutes on 2 cores
#   bash bench/run.sh --smoke    seconds: 50ms measurements, 60 jobs at scale
#   bash bench/run.sh --curve    the cost curve only: the scale scenario at
#                                1,000, 10,000 and 100,000 jobs, 3 and 5
#                                replicas, every backend (about 25 minutes);
#                                lag against jobs in bench/out/curve.svg
#
# Services: PostgreSQL and Redis as for the tests (SCHEDULER_TEST_POSTGRES_DSN,
# SCHEDULER_TEST_REDIS_ADDR, else 127.0.0.1 defaults); redis-server,
# redis-benchmark and pgbench on PATH. Five private redis-server nodes are
# started on free loopback ports for Redlock and redsync, and stopped by pid.
# Extra arguments go to cmd/scheduler-bench (e.g. -duration 5s, -scale "").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
out="${BENCH_OUT:-$here/out}"
mkdir -p "$out"

duration=2s
args=()
curve=
for a in "$@"; do
  case "$a" in
    --smoke) duration=50ms; args+=(-smoke) ;;
    --curve) curve=1; args+=(-claimers "" -scale postgres,redis,redlock,sqlite,etcd -jobs 1000,10000,100000 -replicas 3,5 -curve "$out/curve.svg") ;;
    *) args+=("$a") ;;
  esac
done
redis_addr="${SCHEDULER_TEST_REDIS_ADDR:-127.0.0.1:6379}"

# Five independent nodes, shared by Redlock (scheduler) and redsync (peer).
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
# A random port nothing answers on (bash's /dev/tcp, no other tool needed).
free_port() {
  while :; do
    p=$((20000 + RANDOM % 12000)) # below the kernel's ephemeral range
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
nodes=()
for i in 1 2 3 4 5; do
  port="$(free_port)"
  mkdir -p "$tmp/n$i"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp/n$i" \
    --daemonize no --logfile "$tmp/n$i/log" &
  pids+=($!)
  nodes+=("127.0.0.1:$port")
done
for i in "${!nodes[@]}"; do
  n="${nodes[$i]}"
  for _ in $(seq 1 50); do redis-cli -h "${n%:*}" -p "${n#*:}" ping >/dev/null 2>&1 && break; sleep 0.1; done
  if ! redis-cli -h "${n%:*}" -p "${n#*:}" ping >/dev/null 2>&1; then
    echo "redis-server on $n did not come up:" >&2
    tail -5 "$tmp/n$((i + 1))/log" >&2 || true
    exit 1
  fi
done
redlock="$(IFS=,; echo "${nodes[*]}")"

if [ -n "$curve" ]; then
  echo "== the cost curve (cmd/scheduler-bench)" >&2
  (cd "$root" && go run ./cmd/scheduler-bench -redis "$redis_addr" -redlock "$redlock" \
    -json "$out/curve.json" "${args[@]}") | tee "$out/curve.txt"
  echo "results: $out/curve.json, chart: $out/curve.svg" >&2
  exit 0
fi
echo "== peers (bench/ module)" >&2
(cd "$here" && go run . -redis "$redis_addr" -redlock "$redlock" -duration "$duration" -json "$out/peers.json")
echo "== scheduler claimers, raw references, scale (cmd/scheduler-bench)" >&2
(cd "$root" && go run ./cmd/scheduler-bench -redis "$redis_addr" -redlock "$redlock" -duration "$duration" \
  -peers "$out/peers.json" -json "$out/results.json" -svg "$out/claims.svg" "${args[@]}") | tee "$out/table.txt"
echo "results: $out/results.json, chart: $out/claims.svg" >&2
