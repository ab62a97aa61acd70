package cli

import (
	"reflect"
	"testing"

	"github.com/flamenet/relay/internal/config"
)

// TestRelayConfigCarriesEverySetting: each setting that the server's
// configuration shares by name with the configuration (a number, a
// string, a flag) reaches the server. FN_STREAM_LIFE was read and checked
// but never passed on; this goes red with any such field left out of
// relayConfig.
func TestRelayConfigCarriesEverySetting(t *testing.T) {
	var c config.Config
	cv := reflect.ValueOf(&c).Elem()
	for i := range cv.NumField() {
		f := cv.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			f.SetInt(int64(1000 + i))
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(uint64(1000 + i))
		case reflect.Float32, reflect.Float64:
			f.SetFloat(float64(1000 + i))
		case reflect.String:
			f.SetString("set " + cv.Type().Field(i).Name)
		case reflect.Bool:
			f.SetBool(true)
		}
	}
	rc := relayConfig(c, nil, 0)
	rv := reflect.ValueOf(rc)
	for i := range rv.NumField() {
		name := rv.Type().Field(i).Name
		src := cv.FieldByName(name)
		if !src.IsValid() || src.IsZero() || src.Type() != rv.Field(i).Type() || name == "MaxHeldPolls" {
			// Not a setting of its own name, or not filled above; the held
			// polls' cap is computed from the open-file limit.
			continue
		}
		if !reflect.DeepEqual(src.Interface(), rv.Field(i).Interface()) {
			t.Errorf("relay.Config.%s is %v, not the setting's %v", name, rv.Field(i).Interface(), src.Interface())
		}
	}
}
