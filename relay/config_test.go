package relay

import (
	"reflect"
	"testing"

	"github.com/flamenet/relay/config"
)

// DefaultConfig is the server's configuration at the binary's defaults:
// each field taken from the config package's field of the same name.
func DefaultConfig() Config {
	var c Config
	src, dst := reflect.ValueOf(config.Default()), reflect.ValueOf(&c).Elem()
	for i := range dst.NumField() {
		f := src.FieldByName(dst.Type().Field(i).Name)
		if !f.IsValid() {
			panic("relay.Config." + dst.Type().Field(i).Name + " has no field of that name in config.Config")
		}
		dst.Field(i).Set(f)
	}
	return c
}

// TestDefaultConfig: the defaults tests run with are the binary's.
func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if c.MaxWait != config.Default().MaxWait || c.SendInflight == 0 || c.StoreTimeout == 0 {
		t.Fatalf("defaults not taken from config: %+v", c)
	}
}
