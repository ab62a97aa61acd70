# syntax=docker/dockerfile:1
#
# The relay as a container image: one static binary on distroless, run as a
# non-root user. Build with `docker build -t relay .` (scripts/release.sh
# also stamps the version); deploy/README.md says how to run it.

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
# CGO_ENABLED=0: SQLite is modernc.org/sqlite (pure Go), so the binary needs
# no libc and runs on an image without one.
ENV CGO_ENABLED=0
# The version and commit relay version and fn_build_info report; .git is
# not in the build context, so scripts/release.sh passes them.
ARG VERSION="" REVISION=""
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/relay . \
 && mkdir -p /out/data

# distroless/static: CA certificates (APNs, FCM and UnifiedPush are TLS),
# /etc/passwd with the nonroot user, tzdata, and no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/relay /relay
# SQLite and the generated issuer key live in /data; the volume inherits
# this ownership when Docker first creates it.
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
WORKDIR /data
VOLUME ["/data"]
ENV FN_LISTEN=0.0.0.0:8080 \
    FN_DATABASE_URL=sqlite:/data/relay.db \
    FN_ISSUER_KEY_FILE=/data/issuer.key
EXPOSE 8080 9090
# There is no shell or curl in this image, so the check uses the relay's own
# probe subcommand. It assumes the default port; change it with FN_LISTEN.
# Kubernetes ignores HEALTHCHECK and uses the probes in deploy/kubernetes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/relay", "probe", "http://127.0.0.1:8080/ready"]
ENTRYPOINT ["/relay"]
CMD ["serve"]
