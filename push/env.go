package push

import (
	"fmt"
	"strconv"
)

// ConfigFromEnv reads the FN_PUSH_*, FN_APNS_* and FN_FCM_* settings
// (docs/PUSH.md). Unset means the default. Logger and Registerer are left
// for the caller.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var cfg Config
	var err error
	if cfg.Workers, err = envInt(getenv, "FN_PUSH_WORKERS", DefaultWorkers); err != nil {
		return Config{}, err
	}
	if cfg.QueueSize, err = envInt(getenv, "FN_PUSH_QUEUE", DefaultQueueSize); err != nil {
		return Config{}, err
	}
	if v := getenv("FN_PUSH_ALLOW_PRIVATE"); v != "" {
		if cfg.AllowPrivate, err = strconv.ParseBool(v); err != nil {
			return Config{}, fmt.Errorf("FN_PUSH_ALLOW_PRIVATE=%q: want true or false", v)
		}
	}
	cfg.APNs = APNsConfig{
		KeyFile: getenv("FN_APNS_KEY_FILE"),
		KeyID:   getenv("FN_APNS_KEY_ID"),
		TeamID:  getenv("FN_APNS_TEAM_ID"),
		Topic:   getenv("FN_APNS_TOPIC"),
		URL:     getenv("FN_APNS_URL"),
	}
	cfg.FCM = FCMConfig{
		CredentialsFile: getenv("FN_FCM_CREDENTIALS_FILE"),
		URL:             getenv("FN_FCM_URL"),
		TokenURL:        getenv("FN_FCM_TOKEN_URL"),
	}
	return cfg, nil
}

func envInt(getenv func(string) string, name string, def int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: want a whole number of at least 1", name, v)
	}
	return n, nil
}
