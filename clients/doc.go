// Package clients holds no code: its tests build the clients in the
// directories below and check them against this checkout's relay. The
// TypeScript client (typescript/) is an npm package and a Go module of its
// own, so that the go tool never walks its node_modules.
package clients
