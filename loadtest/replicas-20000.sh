#!/usr/bin/env bash
# Two relays on Postgres with Redis wake-ups, 10,000 held polls on each
# (20,000 in all), every send crossing relays, each relay's Redis publish
# pool capped at 16 connections: the held-poll ceiling the replicas no
# longer have. One tester process cannot hold 20,000 connections where the
# open-file hard limit is 20,000, so two testers run side by side, each
# with 10,000 pairs spread over both relays (its senders on the other
# relay than their recipients), and each writes its own report:
# docs/evidence/pg-2replicas-20000x100-{a,b}.json. Redis's connected
# clients are sampled each second into
# docs/evidence/pg-2replicas-20000x100-redis.txt.
#
#   loadtest/replicas-20000.sh
#
# Needs Postgres (LOAD_PG, default the local server) and redis-server. Run it
# on a quiet machine from a clean tree.
set -euo pipefail
cd "$(dirname "$0")/.."

pg=${LOAD_PG:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
work=$(mktemp -d)
db=relay_bench_split_$(date +%s)_$RANDOM
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	psql "$pg" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

go build -o "$work/relay" .
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
psql "$pg" -qc "CREATE DATABASE $db" >/dev/null
dburl=${pg%/*}/$db?sslmode=disable

keys=$("$work/relay" keygen)
seed=$(awk '/^private:/{print $2}' <<<"$keys")
pub=$(awk '/^public:/{print $2}' <<<"$keys")
# 16 connections per relay: the pool is per GOMAXPROCS.
per_loop=$((16 / $(nproc)))
((per_loop >= 1)) || per_loop=1

urls=() metrics=()
for name in a b; do
	port=$(free_port) mport=$(free_port)
	FN_LISTEN=127.0.0.1:$port FN_METRICS_ADDR=127.0.0.1:$mport FN_DATABASE_URL=$dburl \
		FN_RELAY_REPLICAS=2 FN_REDIS_URL=redis://127.0.0.1:$rport/0 FN_ISSUER_KEYS=$pub \
		FN_REDIS_MAX_CONNECTIONS_PER_LOOP=$per_loop FN_LOG_LEVEL=warn \
		"$work/relay" >"$work/relay-$name.log" 2>&1 &
	pids+=($!)
	urls+=("http://127.0.0.1:$port") metrics+=("http://127.0.0.1:$mport/metrics")
	for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break; sleep 0.1; done
done
url_list=$(IFS=,; echo "${urls[*]}")
metrics_list=$(IFS=,; echo "${metrics[*]}")

out=docs/evidence/pg-2replicas-20000x100-redis.txt
(
	echo "# redis-cli INFO clients, every second, during pg-2replicas-20000x100 (two relays, 20,000 held polls)"
	while sleep 1; do
		printf '%s %s\n' "$(date -u +%H:%M:%S)" "$(redis-cli -p "$rport" info clients | tr -d '\r' | grep '^connected_clients:')"
	done
) >"$out" &
pids+=($!)

testers=()
for half in a b; do
	LOAD_ISSUER_PRIVATE_KEY=$seed go run ./loadtest -url "$url_list" -metrics-url "$metrics_list" \
		-pairs 10000 -rate 50 -duration 60s -wait 20 -name "pg-2replicas-20000x100-$half" \
		-out "docs/evidence/pg-2replicas-20000x100-$half.json" &
	testers+=($!)
done
status=0
for t in "${testers[@]}"; do wait "$t" || status=1; done
exit $status
