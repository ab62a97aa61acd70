#!/usr/bin/env bash
# Streams beside polls, in one sitting: the herd of 5,000 recipients at
# 500 sends a second on Postgres, held as polls by the relay of BEFORE (the
# commit before streams, default 5a87271) and of this checkout, as streams by
# this checkout, and as Centrifugo's uni-directional HTTP streams
# (loadtest/centrifugo), one after another on a quiet machine.
#
#   loadtest/stream-sitting.sh /path/to/centrifugo CENTRIFUGO_COMMIT
#
# Centrifugo is built outside this repository from its public source
# (go build in its checkout). This checkout's runs are scenarios.sh's
# pg-herd-5000x500 and pg-herd-5000x500-stream, rendered on CAPACITY.md;
# the earlier relay's run and Centrifugo's go to docs/evidence/sitting/
# (each report names its command), and CAPACITY.md sets the four side by
# side.
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
mkdir -p "$out"

bin=$(mktemp -d)
trap 'git worktree remove --force "$bin/before-src" 2>/dev/null || true; rm -rf "$bin"' EXIT
git worktree add -q "$bin/before-src" "$before"
(cd "$bin/before-src" && go build -o "$bin/relay-before" .)
go build -o "$bin/loadtest" ./loadtest
go build -o "$bin/centrifugo-driver" ./loadtest/centrifugo

herd=(-store postgres -pairs 5000 -rate 500 -herd -duration 60s -wait 20)
echo "== polls, relay of $before" >&2
"$bin/loadtest" -relay-bin "$bin/relay-before" -relay-commit "$(git rev-parse "$before")" "${herd[@]}" \
	-name "pg-herd-5000x500-$before" -out "$out/pg-herd-5000x500-$before.json"
loadtest/scenarios.sh pg-herd-5000x500 pg-herd-5000x500-stream
echo "== Centrifugo $cf_commit" >&2
"$bin/centrifugo-driver" -bin "$cf_bin" -commit "$cf_commit" -subscribers 5000 -rate 500 \
	-duration 60s -out "$out/centrifugo-herd-5000x500.json"

# The table "Streams beside polls, in one sitting" on CAPACITY.md.
go run ./loadtest/capacity
