package relay

import (
	"testing"

	"github.com/flamenet/relay/internal/config"
)

// DefaultConfig is the server's configuration at the binary's defaults.
func DefaultConfig() Config {
	var c Config
	config.Default().CopyTo(&c)
	return c
}

// TestDefaultConfig: the defaults tests run with are the binary's.
func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if c.MaxWait != config.Default().MaxWait || c.SendInflight == 0 || c.StoreTimeout == 0 {
		t.Fatalf("defaults not taken from config: %+v", c)
	}
}
