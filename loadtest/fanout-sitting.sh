#!/usr/bin/env bash
# What Redis pays for the relays' wake-ups, in one sitting: the relay of
# BEFORE (default 53c7586) and of this checkout, each as 4 relays holding
# 20,000 devices on Postgres at 100 sends a second for 60 s, on two Redis
# setups the script starts and throws away: (a) one Redis server, (b) a Redis
# Cluster of 3 masters and no replicas. Both sides run on the same fresh
# Redis of each setup, one after the other.
#
#   loadtest/fanout-sitting.sh [BEFORE] [OUTDIR]   (OUTDIR: docs/evidence/fanout)
#
# PAIRS, RATE and DURATION (defaults 20000, 100 and 60s; at 200 a 2-core
# machine refuses sends) override the load, for a smoke run: PAIRS=400
# RATE=40 DURATION=5s OUTDIR=/tmp/fanout-smoke loadtest/fanout-sitting.sh. BEFORE and OUTDIR may also come from the
# environment; the arguments win.
#
# One load tester cannot hold 20,000 polls where the open-file hard limit is
# 20,000, so each run is the script's own: it creates a fresh Postgres
# database, makes an issuer key with relay keygen, starts the side's 4 relays
# on them (one after another, each answering /ready before the next starts),
# then runs two load testers side by side against all four (-url, and
# -metrics-url for their CPU, memory and wake-ups), each with PAIRS/2 pairs
# at RATE/2 sends a second, and once both have ended stops the relays
# (SIGTERM, then waits) and drops the database.
#
# Around each pair of testers every Redis node's INFO cpu, stats and
# commandstats are read just before they start (the relays up and ready, so
# their start-up subscriptions are outside) and just after both have ended
# (the relays still up, so their shutdown is outside too), and its pub/sub
# gauges every SAMPLE_EVERY seconds (default 5) in between. OUTDIR/fanout.txt
# gets the commands, the machine, both commits, each run's summary lines,
# and per node and summed: CPU seconds (used_cpu_sys + used_cpu_user),
# network bytes in and out, commands, the pub/sub commands' calls, and the
# pub/sub gauges' peaks; OUTDIR/redis-{single,cluster}-{before,after}.json
# the same Redis figures, for a page to be rendered from. The counts include
# the script's own INFO (about 1.3 KB out per node and sample). The testers'
# JSON reports go beside them
# (OUTDIR/fanout-{single,cluster}-{before,after}-{a,b}.json).
#
# Needs Postgres (LOAD_PG, default the local server), redis-server and
# redis-cli (Redis 7 for a Cluster's sharded pub/sub), curl and jq. Run it
# on a quiet machine from a clean tree.
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ $# -gt 2 ]]; then
	echo "usage: loadtest/fanout-sitting.sh [BEFORE] [OUTDIR]" >&2
	exit 2
fi
before_arg=${1:-${BEFORE:-53c7586}}
outdir=${2:-${OUTDIR:-docs/evidence/fanout}}
pairs=${PAIRS:-20000}
rate=${RATE:-100}
duration=${DURATION:-60s}
sample_every=${SAMPLE_EVERY:-5}
pg=${LOAD_PG:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
if ! [[ $pairs =~ ^[0-9]+$ ]] || ((pairs < 2)); then
	echo "PAIRS=$pairs: want a whole number, 2 or more (half for each load tester)" >&2
	exit 2
fi
# Each load tester gets half the pairs and half the rate (the second the
# odd pair, if any).
pairs_a=$((pairs / 2))
pairs_b=$((pairs - pairs_a))
rate_half=$(awk -v r="$rate" 'BEGIN { printf "%.10g", r / 2 }')
before=$(git rev-parse "$before_arg^{commit}")
after=$(git rev-parse HEAD)
dirty=""
if [[ -n $(git status --porcelain) ]]; then
	dirty=" (dirty tree)"
fi
mkdir -p "$outdir"

tmp=$(mktemp -d)
pids=()        # the redis-servers running now, all started here
relay_pids=()  # the relays running now, all started here
tester_pids=() # the load testers running now
sampler=""     # the pub/sub gauge sampler during a run
db=""          # the run's Postgres database while it exists
cleanup() {
	[[ -n $sampler ]] && kill "$sampler" 2>/dev/null || true
	local p
	for p in "${tester_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${tester_pids[@]}"; do wait "$p" 2>/dev/null || true; done
	stop_relays
	drop_db
	stop_redis
	git worktree remove --force "$tmp/before-src" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

stop_redis() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}

# stop_relays sends the relays SIGTERM, waits for each (SIGKILL after 60 s
# of draining) and puts their exit statuses in relay_exits: "gone (N)" for
# one that had exited before with status N, "killed" for one that needed
# SIGKILL. (Not in a subshell: it waits for the script's own children.)
relay_exits=""
stop_relays() {
	local p i st out=()
	for p in "${relay_pids[@]}"; do
		if kill -0 "$p" 2>/dev/null; then
			kill -TERM "$p" 2>/dev/null || true
			out+=("")
		else
			out+=(gone)
		fi
	done
	for i in "${!relay_pids[@]}"; do
		p=${relay_pids[$i]}
		for _ in $(seq 600); do
			kill -0 "$p" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$p" 2>/dev/null; then
			kill -KILL "$p" 2>/dev/null || true
			out[i]=killed
		fi
		st=0
		wait "$p" 2>/dev/null || st=$?
		if [[ ${out[i]} == gone ]]; then
			out[i]="gone ($st)"
		elif [[ -z ${out[i]} ]]; then
			out[i]=$st
		fi
	done
	relay_pids=()
	relay_exits=$(IFS=,; echo "${out[*]}")
}

# drop_db drops the run's database, if there is one.
drop_db() {
	if [[ -n $db ]]; then
		psql "$pg" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
		db=""
	fi
}

# free_port prints a free loopback port other than 6379 whose cluster bus
# port (+10000) is free too.
free_port() {
	python3 - <<-'EOF'
		import socket
		for _ in range(200):
		    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
		    if p == 6379 or p + 10000 > 65535:
		        s.close(); continue
		    b = socket.socket()
		    try:
		        b.bind(("127.0.0.1", p + 10000))
		    except OSError:
		        s.close(); continue
		    b.close(); s.close(); print(p); break
		else:
		    raise SystemExit("no free port pair")
	EOF
}

# start_redis PORT [ARGS...] starts a redis-server of this script's own on
# PORT and waits until that very process answers there.
start_redis() {
	local port=$1 pid
	shift
	mkdir -p "$tmp/redis-$port"
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--dir "$tmp/redis-$port" "$@" >"$tmp/redis-$port.log" 2>&1 &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 100); do
		if ! kill -0 "$pid" 2>/dev/null; then break; fi
		if [[ $(redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | awk -F: '$1 == "process_id" {print $2}') == "$pid" ]]; then
			return 0
		fi
		sleep 0.1
	done
	echo "redis-server on port $port did not start:" >&2
	cat "$tmp/redis-$port.log" >&2
	exit 1
}

for t in redis-server redis-cli psql curl jq python3; do
	if ! command -v "$t" >/dev/null; then
		echo "fanout-sitting.sh needs $t" >&2
		exit 1
	fi
done
psql "$pg" -qAtc 'SELECT 1' >/dev/null

echo "== building the relays of $before and $after, and the load tester" >&2
git worktree add -q --detach "$tmp/before-src" "$before"
(cd "$tmp/before-src" && go build -o "$tmp/relay-before" .)
go build -o "$tmp/relay-after" .
go build -o "$tmp/loadtest" ./loadtest

# One connection per held poll, and about a thousand more (the load
# tester's own estimate): it warns when it cannot have them, and polls
# past the limit fail. Each tester holds half the polls.
hard=$(ulimit -Hn)
if [[ $hard != unlimited ]] && ((hard < pairs_b + 1088)); then
	echo "warning: the open-file hard limit $hard is below each load tester's need for $pairs_b pairs (about $((pairs_b + 1088)))" >&2
fi
load=(-store postgres -rate "$rate_half" -wait 20 -duration "$duration")

# The machine, for fanout.txt's header and the JSON files.
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
cores=$(nproc)
kernel=$(uname -sr)
go_version=$(go env GOVERSION)
redis_version=$(redis-server --version | awk '{print $3}' | sed 's/^v=//')
machine="$cpu_model, $cores cores (nproc), $kernel, $go_version, redis-server $redis_version"

# The relays' environment: the script's own without its FN_* settings,
# which belong to whatever relay the user runs.
unset_fn=()
while read -r v; do unset_fn+=(-u "$v"); done < <(compgen -e | grep '^FN_' || true)

keys=$("$tmp/relay-after" keygen)
seed=$(awk '/^private:/ {print $2}' <<<"$keys")
pub=$(awk '/^public:/ {print $2}' <<<"$keys")
if [[ -z $seed || -z $pub ]]; then
	echo "relay keygen gave no key pair:" >&2
	echo "$keys" | sed 's/^private:.*/private: (not shown)/' >&2
	exit 1
fi

# db_url NAME is $pg with its database replaced by NAME.
db_url() {
	local base=${pg%%\?*} query=""
	[[ $pg == *\?* ]] && query="?${pg#*\?}"
	echo "${base%/*}/$1$query"
}

relay_urls=() metrics_urls=() relay_shown=""
# start_relays SIDE REDIS_URL NAME creates the run's database and starts the
# side's 4 relays on it and on REDIS_URL, one after another, each ready
# before the next; their logs go to $tmp/NAME-relay-I.log.
start_relays() {
	local side=$1 redis_url=$2 name=$3 i port mport dir log pid ok
	db=relay_bench_fanout_$(date -u +%Y%m%d_%H%M%S)_$RANDOM
	psql "$pg" -qc "CREATE DATABASE $db" >/dev/null
	relay_urls=() metrics_urls=()
	for i in 0 1 2 3; do
		port=$(free_port)
		mport=$(free_port)
		while [[ $mport == "$port" ]]; do mport=$(free_port); done
		dir=$tmp/$name-relay-$i
		log=$tmp/$name-relay-$i.log
		mkdir -p "$dir"
		(
			cd "$dir"
			exec env "${unset_fn[@]}" FN_LISTEN=127.0.0.1:$port FN_METRICS_ADDR=127.0.0.1:$mport \
				FN_DATABASE_URL="$(db_url "$db")" FN_RELAY_REPLICAS=4 FN_REDIS_URL="$redis_url" \
				FN_ISSUER_KEYS="$pub" FN_LOG_LEVEL=warn "$tmp/relay-$side" serve
		) >"$log" 2>&1 &
		pid=$!
		relay_pids+=("$pid")
		relay_urls+=("http://127.0.0.1:$port")
		metrics_urls+=("http://127.0.0.1:$mport/metrics")
		ok=""
		for _ in $(seq 600); do
			kill -0 "$pid" 2>/dev/null || break
			if curl -sf -o /dev/null "http://127.0.0.1:$port/ready"; then
				ok=yes
				break
			fi
			sleep 0.1
		done
		if [[ -z $ok ]]; then
			echo "$name: relay $i (relay-$side) was not ready at http://127.0.0.1:$port/ready in 60 s:" >&2
			tail -n 20 "$log" >&2
			exit 1
		fi
	done
	relay_shown="FN_LISTEN=127.0.0.1:<port> FN_METRICS_ADDR=127.0.0.1:<port> FN_DATABASE_URL=<pg>/$db"
	relay_shown+=" FN_RELAY_REPLICAS=4 FN_REDIS_URL=$redis_url FN_ISSUER_KEYS=<keygen's public key>"
	relay_shown+=" FN_LOG_LEVEL=warn relay-$side serve"
}

# snap TAG reads every node's INFO cpu, stats, memory and commandstats into
# $tmp/TAG-PORT.
snap() {
	local p
	for p in "${ports[@]}"; do
		{
			redis-cli -p "$p" info cpu
			redis-cli -p "$p" info stats
			redis-cli -p "$p" info memory
			redis-cli -p "$p" info commandstats
		} | tr -d '\r' >"$tmp/$1-$p"
	done
}

# sample_gauges FILE appends each node's pub/sub gauges from INFO stats and
# its used_memory to FILE every $sample_every seconds, as "PORT NAME VALUE"
# lines.
sample_gauges() {
	local p
	while :; do
		for p in "${ports[@]}"; do
			{
				redis-cli -p "$p" info stats 2>/dev/null
				redis-cli -p "$p" info memory 2>/dev/null
			} | tr -d '\r' |
				awk -F: -v p="$p" '$1 ~ /^pubsub/ || $1 == "used_memory" {print p, $1, $2}'
		done
		sleep "$sample_every"
	done >>"$1"
}

# The table of one run: every node's differences (after minus before) and
# their sum, the pub/sub gauges before, at their peak and after, and the
# pub/sub commands' calls. The same figures go, tab-separated, to
# $tmp/RUN-figures for redis_json: a "node" line per node and a "sum" line,
# each with cpu_s, net_in, net_out, commands, the pub/sub commands' calls
# and the gauges' peaks ("-" where no sample had the gauge; the sum's peak
# is the sum of the nodes' peaks).
redis_table() {
	local run=$1 p files=()
	for p in "${ports[@]}"; do files+=("$tmp/$run-b-$p" "$tmp/$run-a-$p"); done
	awk -v gauges="$tmp/$run-gauges" -v figs="$tmp/$run-figures" '
		function load(file, m,   line, kv, f, i, n, c) {
			while ((getline line <file) > 0) {
				if (line ~ /^cmdstat_/) {
					split(line, kv, ":")
					n = split(kv[2], f, ",")
					for (i = 1; i <= n; i++) if (f[i] ~ /^calls=/) { c = f[i]; sub(/^calls=/, "", c); m[kv[1]] = c }
				} else if (index(line, ":") > 0) {
					m[substr(line, 1, index(line, ":") - 1)] = substr(line, index(line, ":") + 1)
				}
			}
			close(file)
		}
		function cmd(m, name,   k) { k = "cmdstat_" name; return (k in m) ? m[k] : 0 }
		BEGIN {
			ncmd = split("publish spublish subscribe ssubscribe unsubscribe sunsubscribe psubscribe", cmds, " ")
			ng = split("pubsub_channels pubsub_patterns pubsubshard_channels used_memory", gs, " ")
			while ((getline line <gauges) > 0) {
				split(line, f, " ")
				k = f[1] SUBSEP f[2]
				if (!(k in peak) || f[3] + 0 > peak[k] + 0) peak[k] = f[3]
			}
			for (i = 1; i < ARGC; i += 2) {
				delete b; delete a
				load(ARGV[i], b); load(ARGV[i + 1], a)
				port = ARGV[i]; sub(/.*-/, "", port)
				node[++nn] = "127.0.0.1:" port; nport[nn] = port
				cpu[nn] = (a["used_cpu_sys"] + a["used_cpu_user"]) - (b["used_cpu_sys"] + b["used_cpu_user"])
				nin[nn] = a["total_net_input_bytes"] - b["total_net_input_bytes"]
				nout[nn] = a["total_net_output_bytes"] - b["total_net_output_bytes"]
				ncmds[nn] = a["total_commands_processed"] - b["total_commands_processed"]
				for (j = 1; j <= ncmd; j++) calls[nn, j] = cmd(a, cmds[j]) - cmd(b, cmds[j])
				for (j = 1; j <= ng; j++) {
					gb[nn, j] = (gs[j] in b) ? b[gs[j]] : "-"
					ga[nn, j] = (gs[j] in a) ? a[gs[j]] : "-"
				}
			}
			print "Redis, after minus before the run (INFO cpu: used_cpu_sys + used_cpu_user;"
			print "INFO stats: total_net_input_bytes, total_net_output_bytes, total_commands_processed):"
			printf "  %-17s %12s %16s %16s %12s\n", "node", "cpu_s", "net_in_bytes", "net_out_bytes", "commands"
			for (n = 1; n <= nn; n++) {
				printf "  %-17s %12.6f %16.0f %16.0f %12.0f\n", node[n], cpu[n], nin[n], nout[n], ncmds[n]
				scpu += cpu[n]; sumin += nin[n]; sumout += nout[n]; scmds += ncmds[n]
			}
			printf "  %-17s %12.6f %16.0f %16.0f %12.0f\n", "sum", scpu, sumin, sumout, scmds
			print "Pub/sub commands, calls after minus before (INFO commandstats):"
			printf "  %-17s", "node"
			for (j = 1; j <= ncmd; j++) printf " %12s", cmds[j]
			printf "\n"
			for (n = 1; n <= nn; n++) {
				printf "  %-17s", node[n]
				for (j = 1; j <= ncmd; j++) { printf " %12.0f", calls[n, j]; scalls[j] += calls[n, j] }
				printf "\n"
			}
			printf "  %-17s", "sum"
			for (j = 1; j <= ncmd; j++) printf " %12.0f", scalls[j]
			printf "\n"
			for (n = 1; n <= nn; n++) {
				printf "node\t%s\t%.6f\t%.0f\t%.0f\t%.0f", node[n], cpu[n], nin[n], nout[n], ncmds[n] >figs
				for (j = 1; j <= ncmd; j++) printf "\t%.0f", calls[n, j] >figs
				for (j = 1; j <= ng; j++) {
					k = nport[n] SUBSEP gs[j]
					if (k in peak) { printf "\t%.0f", peak[k] >figs; speak[j] += peak[k]; hpeak[j] = 1 }
					else printf "\t-" >figs
				}
				printf "\n" >figs
			}
			printf "sum\t-\t%.6f\t%.0f\t%.0f\t%.0f", scpu, sumin, sumout, scmds >figs
			for (j = 1; j <= ncmd; j++) printf "\t%.0f", scalls[j] >figs
			for (j = 1; j <= ng; j++) if (j in hpeak) printf "\t%.0f", speak[j] >figs; else printf "\t-" >figs
			printf "\n" >figs
			close(figs)
			print "Gauges (INFO stats; used_memory from INFO memory), before / peak of the samples during the run / after:"
			printf "  %-17s", "node"
			for (j = 1; j <= ng; j++) printf " %24s", gs[j]
			printf "\n"
			for (n = 1; n <= nn; n++) {
				printf "  %-17s", node[n]
				for (j = 1; j <= ng; j++) {
					k = nport[n] SUBSEP gs[j]
					printf " %24s", gb[n, j] " / " ((k in peak) ? peak[k] : "-") " / " ga[n, j]
				}
				printf "\n"
			}
		}' "${files[@]}"
}

# redis_json RUN SETUP SIDE COMMIT DIRTY DATE URL prints the JSON of one
# run's Redis figures, from $tmp/RUN-figures (redis_table writes it).
redis_json() {
	local run=$1
	jq -n --arg setup "$2" --arg side "$3" --arg commit "$4" --argjson dirty "$5" --arg date "$6" \
		--arg redis "$7" --arg before "$before" --arg after "$after" \
		--arg cpu "$cpu_model" --argjson cores "$cores" --arg kernel "$kernel" --arg go "$go_version" \
		--arg redis_version "$redis_version" --arg machine "$machine" \
		--argjson pairs "$pairs" --arg rate "$rate" --arg duration "$duration" --argjson sample_every "$sample_every" \
		--arg report_a "$run-a.json" --arg report_b "$run-b.json" --rawfile rows "$tmp/$run-figures" '
		["publish", "spublish", "subscribe", "ssubscribe", "unsubscribe", "sunsubscribe", "psubscribe"] as $cmds
		| ["pubsub_channels", "pubsub_patterns", "pubsubshard_channels", "used_memory"] as $gauges
		| def num: if . == "-" then null else tonumber end;
		  def figures: {
			cpu_seconds: (.[2] | num), net_in_bytes: (.[3] | num), net_out_bytes: (.[4] | num),
			commands: (.[5] | num),
			pubsub_calls: ([range($cmds | length) as $j | {key: $cmds[$j], value: (.[6 + $j] | num)}] | from_entries),
			pubsub_gauge_peaks: ([range($gauges | length) as $j
				| {key: $gauges[$j], value: (.[6 + ($cmds | length) + $j] | num)}] | from_entries)
		  };
		($rows | split("\n") | map(select(length > 0) | split("\t"))) as $r
		| {
			setup: $setup, side: $side,
			relay_commit: $commit, relay_dirty: $dirty, before: $before, after: $after,
			date: $date,
			machine: {description: $machine, cpu: $cpu, cores: $cores, kernel: $kernel, go: $go, redis_server: $redis_version},
			redis: $redis,
			relays: 4, load_testers: 2, pairs: $pairs, rate: ($rate | tonumber), duration: $duration,
			reports: [$report_a, $report_b],
			window: "from just before the two load testers start (the relays up and ready) to just after both have ended (the relays not yet stopped)",
			units: "cpu_seconds: used_cpu_sys + used_cpu_user; bytes and commands: INFO stats total_net_input_bytes, total_net_output_bytes, total_commands_processed; pubsub_calls: INFO commandstats calls; all after minus before the window. pubsub_gauge_peaks: the highest INFO stats value sampled every sample_every_seconds in the window (the sum: the sum of the peaks of the nodes)",
			sample_every_seconds: $sample_every,
			nodes: [$r[] | select(.[0] == "node") | {node: .[1]} + figures],
			sum: ([$r[] | select(.[0] == "sum") | figures] | first)
		}'
}

sections=()
status=0
# measure SETUP SIDE URL runs the side's relays on the running Redis setup
# and two load testers against them, adds the run's section to the report
# and writes its Redis figures to OUTDIR/redis-SETUP-SIDE.json.
measure() {
	local setup=$1 side=$2 url=$3 commit name half a shown rc when rdirty=false i n
	commit=$before
	[[ $side == after ]] && commit=$after
	[[ $side == after && -n $dirty ]] && rdirty=true
	name=fanout-$setup-$side
	when=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
	echo "== $name: relay $side ($commit), $setup Redis" >&2
	start_relays "$side" "$url" "$name"
	local url_list metrics_list
	url_list=$(IFS=,; echo "${relay_urls[*]}")
	metrics_list=$(IFS=,; echo "${metrics_urls[*]}")
	# -relay-commit labels only a relay the tester starts; against -url the
	# report's git is -src's checkout, so the before side's is its worktree.
	local src=()
	[[ $side == before ]] && src=(-src "$tmp/before-src")
	local tester=("$tmp/loadtest" -url "$url_list" -metrics-url "$metrics_list" "${src[@]}" "${load[@]}")
	local cmd_a=("${tester[@]}" -pairs "$pairs_a" -name "$name-a" -out "$outdir/$name-a.json")
	local cmd_b=("${tester[@]}" -pairs "$pairs_b" -name "$name-b" -out "$outdir/$name-b.json")
	local shown_a="LOAD_ISSUER_PRIVATE_KEY=<keygen's private key>" shown_b
	for a in "${cmd_a[@]}"; do
		a=${a#"$tmp/"}
		[[ $a == *[^A-Za-z0-9_./:=,@+-]* ]] && a="'$a'"
		shown_a+=" $a"
	done
	shown_b=${shown_a/" -pairs $pairs_a "/" -pairs $pairs_b "}
	shown_b=${shown_b//"$name-a"/"$name-b"}
	: >"$tmp/$name-gauges"
	snap "$name-b"
	sample_gauges "$tmp/$name-gauges" &
	sampler=$!
	LOAD_ISSUER_PRIVATE_KEY=$seed "${cmd_a[@]}" >"$tmp/$name-a.out" 2>"$tmp/$name-a.log" &
	tester_pids=($!)
	LOAD_ISSUER_PRIVATE_KEY=$seed "${cmd_b[@]}" >"$tmp/$name-b.out" 2>"$tmp/$name-b.log" &
	tester_pids+=($!)
	# The sends alone, without the population's arrival (its
	# registrations, first polls and, on the relay of this checkout, one
	# subscription and one presence message per device): from both
	# testers sending until 10 s before the sends end.
	local steady=""
	if [[ $duration =~ ^([0-9]+)s$ ]] && ((BASH_REMATCH[1] > 10)); then
		for _ in $(seq 2400); do
			if grep -q 'msg=sending' "$tmp/$name-a.log" && grep -q 'msg=sending' "$tmp/$name-b.log"; then
				steady=$((BASH_REMATCH[1] - 10))
				break
			fi
			kill -0 "${tester_pids[0]}" 2>/dev/null || kill -0 "${tester_pids[1]}" 2>/dev/null || break
			sleep 0.5
		done
	fi
	if [[ -n $steady ]]; then
		snap "$name-steady-b"
		sleep "$steady"
		snap "$name-steady-a"
	fi
	local rc_a=0 rc_b=0
	wait "${tester_pids[0]}" || rc_a=$?
	wait "${tester_pids[1]}" || rc_b=$?
	tester_pids=()
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	sampler=""
	snap "$name-a"
	stop_relays
	drop_db
	for half in a b; do
		rc=rc_$half
		if [[ ! -s $tmp/$name-$half.out ]]; then
			echo "$name-$half: the load tester gave no summary (exit ${!rc}):" >&2
			cat "$tmp/$name-$half.log" >&2
			exit 1
		fi
		((${!rc} == 0)) || status=1
	done
	[[ $relay_exits == 0,0,0,0 ]] || status=1
	sections+=("$(
		echo "== $name"
		echo "relay: $side, $commit"
		echo "redis: $url"
		echo "relays, started by this script one after another on a fresh database, each ready before the next:"
		echo "  $relay_shown"
		echo "  stopped after both testers with SIGTERM; exit statuses: $relay_exits"
		for i in 0 1 2 3; do
			n=$(wc -l <"$tmp/$name-relay-$i.log")
			echo "  relay $i's log (FN_LOG_LEVEL=warn): $n lines"
			head -n 3 "$tmp/$name-relay-$i.log" | cut -c1-300 | sed 's/^/    /'
		done
		echo "command a: $shown_a"
		echo "command b: $shown_b"
		echo "exit status: a $rc_a, b $rc_b"
		for half in a b; do
			echo "load tester $half's stdout (its summary lines):"
			sed 's/^/  /' "$tmp/$name-$half.out"
		done
		redis_table "$name"
		if [[ -n $steady ]]; then
			echo "During the sends alone: $steady s from both testers sending (the same figures; the"
			echo "gauges as above):"
			: >"$tmp/$name-steady-gauges"
			redis_table "$name-steady" | sed '/^Gauges/,$d'
		fi
	)")
	redis_json "$name" "$setup" "$side" "$commit" "$rdirty" "$when" "$url" >"$outdir/redis-$setup-$side.json"
	if [[ -n $steady ]]; then
		redis_json "$name-steady" "$setup" "$side" "$commit" "$rdirty" "$when" "$url" |
			jq --argjson s "$steady" --arg a "$name-a.json" --arg b "$name-b.json" \
				'.window = "the sends alone: \($s) s from both load testers sending" | .window_seconds = $s | .reports = [$a, $b]' \
				>"$outdir/redis-steady-$setup-$side.json"
	fi
}

# (a) One Redis server.
port=$(free_port)
start_redis "$port"
ports=("$port")
single_url=redis://127.0.0.1:$port
measure single before "$single_url"
measure single after "$single_url"
stop_redis

# (b) A Redis Cluster of 3 masters and no replicas.
ports=()
for _ in 1 2 3; do
	port=$(free_port)
	start_redis "$port" --cluster-enabled yes --cluster-config-file "$tmp/redis-$port/nodes-$port.conf" \
		--cluster-node-timeout 2000
	ports+=("$port")
done
redis-cli --cluster create "127.0.0.1:${ports[0]}" "127.0.0.1:${ports[1]}" "127.0.0.1:${ports[2]}" \
	--cluster-replicas 0 --cluster-yes >"$tmp/cluster-create.log" 2>&1 || {
	cat "$tmp/cluster-create.log" >&2
	exit 1
}
ok=""
for _ in $(seq 300); do
	ok=yes
	for p in "${ports[@]}"; do
		redis-cli -p "$p" cluster info 2>/dev/null | tr -d '\r' | grep -qx 'cluster_state:ok' || ok=""
	done
	[[ -n $ok ]] && break
	sleep 0.1
done
if [[ -z $ok ]]; then
	echo "the Redis Cluster did not reach cluster_state:ok in 30 s" >&2
	exit 1
fi
cluster_url="redis://127.0.0.1:${ports[0]}?cluster=true&addr=127.0.0.1:${ports[1]}&addr=127.0.0.1:${ports[2]}"
measure cluster before "$cluster_url"
measure cluster after "$cluster_url"
stop_redis

{
	echo "# Redis under the relays' wake-ups, in one sitting: the relay of BEFORE and of this checkout,"
	echo "# 4 relays each, on one Redis server and on a Redis Cluster of 3 masters and no replicas"
	echo "#"
	echo "# before: $before; after: $after$dirty"
	echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "# machine: $machine"
	echo "# command: PAIRS=$pairs RATE=$rate DURATION=$duration loadtest/fanout-sitting.sh $before_arg $outdir"
	echo "#   built: git worktree of BEFORE, go build -o relay-before .; here go build -o relay-after ."
	echo "#   and go build -o loadtest ./loadtest (this checkout's load tester for both sides)"
	echo "#   redis-server --port P --bind 127.0.0.1 --save \"\" --appendonly no --dir <temp dir>"
	echo "#     Cluster: the same with --cluster-enabled yes --cluster-config-file <temp dir>/nodes-P.conf"
	echo "#     --cluster-node-timeout 2000, joined by redis-cli --cluster create 127.0.0.1:P1 127.0.0.1:P2"
	echo "#     127.0.0.1:P3 --cluster-replicas 0 --cluster-yes, once every node says cluster_state:ok"
	echo "#   each run: a fresh Postgres database (CREATE DATABASE on LOAD_PG's server, dropped after the"
	echo "#   run), relay keygen's key pair (made once; the relays trust its public key, the testers sign"
	echo "#   with its private one), the side's 4 relays started by this script one after another"
	echo "#   (each answering /ready before the next starts), then two load testers side by side, a and"
	echo "#   b, each with half the pairs ($pairs_a and $pairs_b) at half the rate ($rate_half a second)"
	echo "#   against all four relays (-url, and -metrics-url in the same order), then the relays"
	echo "#   stopped with SIGTERM and waited for"
	echo "#   around the two testers: redis-cli -p P info cpu, info stats and info commandstats on every"
	echo "#   node just before they start (the relays already up and ready, so their start-up and its"
	echo "#   subscriptions are outside) and just after both have ended (the relays still up, their"
	echo "#   shutdown outside too); info stats' pub/sub gauges every $sample_every s in between. The window"
	echo "#   holds the testers' own set-up (devices registered, polls opened: the relays' per-device"
	echo "#   subscriptions, where they make them) and drain besides the sends, so it is wider than a"
	echo "#   tester's measured window, over which its relay cpu and wake lines are read; a second"
	echo "#   reading, \"during the sends alone\", runs from the moment both testers log that they are"
	echo "#   sending until 10 s before their sends end, without the population's arrival"
	echo "# each tester's summary (relay cpu and rss) and its per-relay wake lines (relay N: wakes"
	echo "#   received=...), like its report's wakes field, read the four relays' counters over that"
	echo "#   tester's own window: both testers load the same four relays, so they cover both testers'"
	echo "#   sends and polls, not that tester's alone (do not add a's and b's). Delivery and latency are"
	echo "#   each tester's own pairs'. The reports' git is the relay's checkout (-src: the worktree of"
	echo "#   BEFORE for the before side), as -relay-commit labels only a relay the tester starts"
	echo "# Redis figures per run, as JSON: redis-{single,cluster}-{before,after}.json beside this file,"
	echo "#   and the sends alone in redis-steady-{single,cluster}-{before,after}.json"
	echo "# open files: $(ulimit -Sn) soft, $(ulimit -Hn) hard (each load tester raises its soft limit up to the hard one)"
	for s in "${sections[@]}"; do
		echo
		echo "$s"
	done
} >"$outdir/fanout.txt"
echo "wrote $outdir/fanout.txt" >&2
exit $status
