package push

import "github.com/flamenet/relay/device"

// newProviders builds the enabled providers: UnifiedPush always, Web Push
// when the relay has a VAPID key, APNs when a key file is set, FCM when a
// credentials file is set.
func newProviders(cfg Config) (map[string]Provider, error) {
	up := newUnifiedPush(cfg)
	ps := map[string]Provider{device.PushUnifiedPush: up}
	if cfg.WebPush.VAPID != nil {
		// UnifiedPush's sender, its guarded dialer and its connections:
		// the endpoints are the same kind of URL, given by the public.
		ps[device.PushWebPush] = webPushProvider{w: up.web}
	}
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
