#!/usr/bin/env bash
# Streams beside polls, in one sitting: the herd of 5,000 recipients at
# 500 sends a second on Postgres, held as polls by the relay of BEFORE (the
# commit before streams, default 5a87271) and of this checkout, as streams by
# this checkout, and as Centrifugo's uni-directional HTTP streams
# (loadtest/centrifugo), on a quiet machine.
#
#   loadtest/stream-sitting.sh /path/to/centrifugo CENTRIFUGO_COMMIT [BEFORE]
#
# The four run one after another in ROUNDS rounds (default 3), each round
# starting one further along, so that no run always comes first or after
# the same one: this machine's CPU time per message varies by a tenth
# from one run to the next, and CAPACITY.md sets the medians side by side.
# Centrifugo is built outside this repository from its public source (go
# build in its checkout). Every run goes to docs/evidence/sitting/, each
# report naming its command and commit.
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ $# -lt 2 ]]; then
	echo "usage: loadtest/stream-sitting.sh CENTRIFUGO_BIN CENTRIFUGO_COMMIT [BEFORE]" >&2
	exit 2
fi
cf_bin=$1
cf_commit=$2
before=${3:-5a87271}
out=docs/evidence/sitting
rounds=${ROUNDS:-3}

# The evidence names the commit that built the relay: the tree must be it.
if [[ -n "$(git status --porcelain -- . ':(exclude)docs/evidence' ':(exclude)docs/CAPACITY.md')" ]]; then
	echo "stream-sitting.sh: commit first; the runs name the checkout's commit" >&2
	exit 2
fi
commit=$(git rev-parse HEAD)

bin=$(mktemp -d)
trap 'git worktree remove --force "$bin/before-src" 2>/dev/null || true; rm -rf "$bin"' EXIT
git worktree add -q "$bin/before-src" "$before"
(cd "$bin/before-src" && go build -o "$bin/relay-before" .)
go build -o "$bin/relay" .
go build -o "$bin/loadtest" ./loadtest
go build -o "$bin/centrifugo-driver" ./loadtest/centrifugo

mkdir -p "$out"
rm -f "$out"/*.json

herd=(-store postgres -pairs 5000 -rate 500 -herd -duration 60s -wait 20)
run() { # run KIND ROUND
	local name
	case $1 in
	before)
		name=pg-herd-5000x500-$before-r$2
		"$bin/loadtest" -relay-bin "$bin/relay-before" -relay-commit "$(git rev-parse "$before")" "${herd[@]}" \
			-name "$name" -out "$out/$name.json" ;;
	polls)
		name=pg-herd-5000x500-r$2
		"$bin/loadtest" -relay-bin "$bin/relay" -relay-commit "$commit" "${herd[@]}" -name "$name" -out "$out/$name.json" ;;
	streams)
		name=pg-herd-5000x500-stream-r$2
		"$bin/loadtest" -relay-bin "$bin/relay" -relay-commit "$commit" "${herd[@]}" -stream -name "$name" -out "$out/$name.json" ;;
	centrifugo)
		"$bin/centrifugo-driver" -bin "$cf_bin" -commit "$cf_commit" -subscribers 5000 -rate 500 \
			-duration 60s -out "$out/centrifugo-herd-5000x500-r$2.json" ;;
	esac
}

kinds=(before polls streams centrifugo)
for ((r = 1; r <= rounds; r++)); do
	for ((i = 0; i < ${#kinds[@]}; i++)); do
		kind=${kinds[(i + r - 1) % ${#kinds[@]}]}
		echo "== round $r: $kind" >&2
		run "$kind" "$r"
	done
done

# The table "Streams beside polls, in one sitting" on CAPACITY.md.
go run ./loadtest/capacity
