// Package clients holds no code: its tests build the TypeScript client
// (client/typescript) and check it, in Node and in Chromium, against this
// checkout's relay. The client is an npm package and a Go module of its
// own, so that the go tool never walks its node_modules.
package clients
