package push

import "github.com/flamenet/relay/device"

// newProviders builds the enabled providers: UnifiedPush always, APNs when
// a key file is set, FCM when a credentials file is set.
func newProviders(cfg Config) (map[string]Provider, error) {
	ps := map[string]Provider{device.PushUnifiedPush: newUnifiedPush(cfg)}
	if cfg.APNs.KeyFile != "" {
		a, err := newAPNs(cfg.APNs, cfg.ResponseHeaderTimeout, cfg.AttemptTimeout)
		if err != nil {
			closeProviders(ps)
			return nil, err
		}
		ps[device.PushAPNs] = a
	}
	if cfg.FCM.CredentialsFile != "" {
		f, err := newFCM(cfg.FCM, cfg.ResponseHeaderTimeout, cfg.AttemptTimeout)
		if err != nil {
			closeProviders(ps)
			return nil, err
		}
		ps[device.PushFCM] = f
	}
	return ps, nil
}

func closeProviders(ps map[string]Provider) {
	for _, p := range ps {
		p.Close()
	}
}
