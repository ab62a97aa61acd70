// Package deploy holds what an operator copies to run the relay: the
// systemd unit, the HAProxy configuration of compose.replicas.yaml, the
// Kubernetes manifests and the Caddy and nginx TLS samples (the Dockerfile
// and compose files sit at the repository root). It has no code; its tests
// check that those files agree with each other and with the relay's
// settings, and run the TLS samples under the real proxies in front of the
// relay.
package deploy
