// The TypeScript client is an npm package, not Go code: this file makes its
// directory a module of its own, so that the relay module's go vet ./... and
// go test ./... never walk into node_modules.
module github.com/flamenet/relay/client/typescript

go 1.26.0
