#!/usr/bin/env bash
# Builds a release of the relay: static binaries for linux/amd64 and
# linux/arm64 in dist/, dist/SHA256SUMS, and the container image, all
# stamped with one version. docs/OPERATIONS.md (Releasing) has the steps.
#
#   scripts/release.sh [--dry-run] [VERSION]
#
# VERSION defaults to `git describe --tags --always --dirty`.
# --dry-run builds and checks the binaries and checksums (static, the right
# architecture, the stamped version) and prints the image command instead
# of running it; CI runs it.
# IMAGE (default relay) names the image. With PUSH=1 the image is built for
# both architectures with docker buildx and pushed to IMAGE:VERSION;
# otherwise it is built for this machine and loaded into the local docker.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

dry_run=0
version=""
for arg in "$@"; do
  case $arg in
    --dry-run) dry_run=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "release: unknown option $arg" >&2; usage >&2; exit 2 ;;
    *)
      if [ -n "$version" ]; then echo "release: one VERSION only" >&2; exit 2; fi
      version=$arg
      ;;
  esac
done
version=${version:-$(git describe --tags --always --dirty)}
revision=$(git rev-parse HEAD)
# The version lands in file names, an image tag and -ldflags.
if ! [[ $version =~ ^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$ ]]; then
  echo "release: version \"$version\" is not [A-Za-z0-9._+-]" >&2
  exit 2
fi
image=${IMAGE:-relay}

echo "release $version (commit $revision)"
rm -rf dist
mkdir -p dist
ldflags="-s -w -X main.version=$version -X main.revision=$revision"
bins=()
for arch in amd64 arm64; do
  bin=dist/relay-$version-linux-$arch
  # -buildvcs=false: the commit is stamped explicitly, the same way inside
  # the image (whose build context has no .git).
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$bin" .
  bins+=("$bin")
done
(cd dist && sha256sum relay-* >SHA256SUMS)

# Checks: static executables of the named architecture, checksums that
# verify, and the version the amd64 binary reports.
go run ./scripts/elfstatic "${bins[@]}"
(cd dist && sha256sum --quiet -c SHA256SUMS)
if [ "$(go env GOHOSTARCH)" = amd64 ] && [ "$(go env GOHOSTOS)" = linux ]; then
  got=$("dist/relay-$version-linux-amd64" version)
  case $got in
    "relay $version (rev ${revision:0:12}) "*) echo "$got" ;;
    *) echo "release: the amd64 binary says \"$got\", want relay $version (rev ${revision:0:12})" >&2; exit 1 ;;
  esac
else
  echo "release: not on linux/amd64, the stamped version is not run"
fi

build_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision" -t "$image:$version" .)
if [ "${PUSH:-}" = 1 ]; then
  image_cmd=(docker buildx build --platform linux/amd64,linux/arm64 --push "${build_args[@]}")
elif docker buildx version >/dev/null 2>&1; then
  image_cmd=(docker buildx build --load "${build_args[@]}")
else
  image_cmd=(docker build "${build_args[@]}")
fi
if ((dry_run)); then
  echo "dry run; the image would be built with:"
  echo "  ${image_cmd[*]}"
  exit 0
fi
"${image_cmd[@]}"
echo "release $version: dist/ and $image:$version"
