// Command centrifugo measures Centrifugo's CPU time per delivered message in
// the shape of our relay's herd benchmark, so the two can be set side by
// side: N subscribers each hold one uni-directional HTTP stream
// (POST /connection/uni_http_stream) that Centrifugo subscribes server-side
// to a channel of the subscriber's own, and the server HTTP API publishes to
// those channels open-loop at a fixed total rate. Channel history and
// recovery stay off, as our stream does not commit either. It reports
// losses, duplicates, publish-started→received latency, Centrifugo's CPU
// seconds from the first publish to the end of the drain, and its peak RSS.
//
// Centrifugo is not part of this repository: it is built outside it from its
// public source and passed with -bin. This driver writes a config, starts
// the binary on a free loopback port, and stops it at the end.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flamenet/relay/internal/procstat"
)

type config struct {
	bin, commit, out string
	subscribers      int
	rate             float64
	duration, drain  time.Duration
	herd             bool
}

func main() {
	var cfg config
	flag.StringVar(&cfg.bin, "bin", "", "path of the centrifugo binary (required)")
	flag.StringVar(&cfg.commit, "commit", "", "Centrifugo commit the binary was built from, recorded in the report")
	flag.IntVar(&cfg.subscribers, "subscribers", 5000, "subscribers, each with its own stream, user and channel")
	flag.Float64Var(&cfg.rate, "rate", 500, "total publishes per second")
	flag.DurationVar(&cfg.duration, "duration", 60*time.Second, "publishing window")
	flag.DurationVar(&cfg.drain, "drain", 10*time.Second, "longest wait for deliveries after the last publish")
	flag.BoolVar(&cfg.herd, "herd", true, "all subscribers connect at the same instant (else at most 64 at a time)")
	flag.StringVar(&cfg.out, "out", "", "optional path of a JSON report")
	flag.Parse()
	if cfg.bin == "" || cfg.subscribers < 1 || cfg.rate <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	rep, err := run(ctx, cfg)
	stop()
	if err == nil && cfg.out != "" {
		data, _ := json.MarshalIndent(rep, "", "  ")
		err = os.WriteFile(cfg.out, append(data, '\n'), 0o644)
	}
	if rep != nil {
		fmt.Println(rep.summary())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "centrifugo:", err)
		os.Exit(1)
	}
	if rep.Lost > 0 || rep.Duplicates > 0 || rep.Stray > 0 || rep.Rejected > 0 {
		os.Exit(1)
	}
}

type report struct {
	Date            time.Time `json:"date"` // when the run started
	Version         string    `json:"centrifugo_version"`
	Commit          string    `json:"centrifugo_commit"`
	CPUModel        string    `json:"cpu_model"`
	NProc           int       `json:"nproc"`
	Command         []string  `json:"command"`
	Subscribers     int       `json:"subscribers"`
	Herd            bool      `json:"herd"`
	ConnectSeconds  float64   `json:"connect_seconds"`
	DurationSeconds float64   `json:"duration_seconds"`
	WindowSeconds   float64   `json:"window_seconds"` // first publish to end of drain
	OfferedRate     float64   `json:"offered_rate"`
	AchievedRate    float64   `json:"achieved_rate"`
	Accepted        int       `json:"accepted"`
	Rejected        int       `json:"rejected"`
	Delivered       int       `json:"delivered"`
	Lost            int       `json:"lost"`
	Duplicates      int       `json:"duplicates"`
	Stray           int       `json:"stray"`          // delivered to a stream it was not for
	P50MS           float64   `json:"latency_p50_ms"` // publish started to received
	P99MS           float64   `json:"latency_p99_ms"`
	CPUSeconds      float64   `json:"cpu_seconds"`
	CPUMicrosMsg    float64   `json:"cpu_us_per_delivered"`
	PeakRSSBytes    int64     `json:"peak_rss_bytes"`
}

func (r *report) summary() string {
	return fmt.Sprintf("%s: subscribers=%d herd=%t offered=%.1f/s achieved=%.1f/s accepted=%d delivered=%d lost=%d dup=%d stray=%d rejected=%d p50=%.2fms p99=%.2fms cpu=%.2fs cpu/msg=%.1fus rss_peak=%.1fMiB",
		r.Version, r.Subscribers, r.Herd, r.OfferedRate, r.AchievedRate, r.Accepted, r.Delivered,
		r.Lost, r.Duplicates, r.Stray, r.Rejected, r.P50MS, r.P99MS,
		r.CPUSeconds, r.CPUMicrosMsg, float64(r.PeakRSSBytes)/(1<<20))
}

// publishLimit bounds publishes in flight only to keep the driver alive if
// Centrifugo stalls; one held back starts late and its latency shows it.
const publishLimit = 1024

// bench is one run's shared state. Per-publish slices are indexed by
// publish id; each slot is written by one goroutine only, or atomically.
type bench struct {
	cfg      config
	base     string // http://127.0.0.1:port
	apiKey   string
	secret   []byte
	client   *http.Client
	origin   time.Time      // receive times are kept as time since origin
	target   []int          // publish id -> subscriber
	started  []time.Time    // when the publish request began
	accepted []bool         // Centrifugo answered the publish with a result
	count    []atomic.Int32 // deliveries of each id
	recvAt   []atomic.Int64 // first delivery
	stray    atomic.Int64   // deliveries to a stream they were not for
}

func run(ctx context.Context, cfg config) (*report, error) {
	rep := &report{Date: time.Now().UTC(), Command: os.Args, Subscribers: cfg.subscribers, Herd: cfg.herd,
		OfferedRate: cfg.rate, DurationSeconds: cfg.duration.Seconds()}
	rep.CPUModel, rep.NProc, rep.Commit = procstat.CPUModel(), runtime.NumCPU(), cfg.commit
	v, err := exec.Command(cfg.bin, "version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s version: %w", cfg.bin, err)
	}
	rep.Version = strings.TrimSpace(string(v))
	// Raised before the start so that Centrifugo inherits it: each stream
	// costs a descriptor on both sides, and each publish one more.
	if err := raiseNoFile(cfg.subscribers + publishLimit + 256); err != nil {
		return nil, err
	}

	b := &bench{cfg: cfg, apiKey: randHex(16), secret: []byte(randHex(32))}
	dir, err := os.MkdirTemp("", "centrifugo-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := b.startServer(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer srv.stop()

	// No client Timeout: streams last the whole run. Publishes come in
	// bursts, so a large idle pool keeps them on reused connections
	// instead of the default two per host.
	b.client = &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: publishLimit,
		DisableCompression:  true,
	}}
	n := int(cfg.duration.Seconds()*cfg.rate + 1e-9)
	order := mrand.Perm(cfg.subscribers)
	b.target = make([]int, n)
	for i := range b.target {
		b.target[i] = order[i%cfg.subscribers]
	}
	b.started, b.accepted = make([]time.Time, n), make([]bool, n)
	b.count, b.recvAt = make([]atomic.Int32, n), make([]atomic.Int64, n)
	b.origin = time.Now()

	streamCtx, endStreams := context.WithCancel(ctx)
	var streams sync.WaitGroup
	defer func() { endStreams(); streams.Wait() }()
	if err := b.connectAll(streamCtx, &streams); err != nil {
		return nil, err
	}
	rep.ConnectSeconds = round(time.Since(b.origin).Seconds(), 3)

	pid := srv.cmd.Process.Pid
	cpu0, _, err := procStats(pid)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	pubCtx, endPubs := context.WithDeadline(ctx, start.Add(cfg.duration+cfg.drain))
	defer endPubs()
	b.publishAll(pubCtx, start, n)
	// Drain: wait for every accepted publish to arrive, bounded.
	for deadline := time.Now().Add(cfg.drain); b.owed() > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	rep.WindowSeconds = round(time.Since(start).Seconds(), 3)
	cpu1, hwm, err := procStats(pid)
	if err != nil {
		return nil, err
	}
	rep.PeakRSSBytes = hwm
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	endStreams()
	streams.Wait()

	b.tally(rep, start)
	rep.CPUSeconds = round(cpu1-cpu0, 2)
	if rep.Delivered > 0 {
		rep.CPUMicrosMsg = round((cpu1-cpu0)*1e6/float64(rep.Delivered), 1)
	}
	return rep, nil
}

// tally checks every accepted publish arrived exactly once and fills in the
// counts, rate and latency.
func (b *bench) tally(rep *report, start time.Time) {
	var last time.Time
	var lat []time.Duration
	for i := range b.target {
		c := int(b.count[i].Load())
		rep.Duplicates += max(0, c-1)
		if !b.accepted[i] {
			rep.Rejected++
			continue
		}
		rep.Accepted++
		if b.started[i].After(last) {
			last = b.started[i]
		}
		if c == 0 {
			rep.Lost++
			continue
		}
		rep.Delivered++
		lat = append(lat, b.origin.Add(time.Duration(b.recvAt[i].Load())).Sub(b.started[i]))
	}
	rep.Stray = int(b.stray.Load())
	// Over the offered window, or longer if publishes started late, as our
	// relay's load tester counts it: falling behind lowers the rate.
	if span := max(b.cfg.duration, last.Sub(start)).Seconds(); span > 0 {
		rep.AchievedRate = round(float64(rep.Accepted)/span, 2)
	}
	slices.Sort(lat)
	rep.P50MS, rep.P99MS = percentileMS(lat, 0.50), percentileMS(lat, 0.99)
}

type server struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returns
}

// startServer writes the config and starts Centrifugo on a free loopback
// port, returning once its health endpoint answers.
func (b *bench) startServer(ctx context.Context, dir string) (*server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b.base = "http://127.0.0.1:" + strconv.Itoa(port)
	type obj = map[string]any
	conf := obj{
		// Loopback only; with no internal port set, the API and health
		// endpoints share this one.
		"http_server": obj{"address": "127.0.0.1", "port": port},
		// Connection JWTs are HS256; their "channels" claim subscribes the
		// stream server-side, as a uni-directional client cannot subscribe.
		"client":          obj{"token": obj{"hmac_secret_key": string(b.secret)}},
		"http_api":        obj{"key": b.apiKey},
		"uni_http_stream": obj{"enabled": true},
		"health":          obj{"enabled": true}, // readiness probe
		"usage_stats":     obj{"disabled": true},
		// The defaults, spelled out: no history, recovery, positioning,
		// presence or join/leave, so a publish is only fanned out.
		"channel": obj{"without_namespace": obj{"history_size": 0, "force_recovery": false,
			"force_positioning": false, "presence": false, "join_leave": false}},
	}
	path, logPath := filepath.Join(dir, "config.json"), filepath.Join(dir, "centrifugo.log")
	data, _ := json.MarshalIndent(conf, "", "  ")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s := &server{cmd: exec.Command(b.cfg.bin, "--config", path), exited: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(b.base + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("centrifugo exited at start; log:\n%s", tail(logPath))
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		default:
		}
	}
	s.stop()
	return nil, fmt.Errorf("centrifugo did not answer in 20s; log:\n%s", tail(logPath))
}

// stop asks Centrifugo to stop, then kills it if it lingers.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// connectAll opens every stream and returns once each has its connect
// frame, which lists the subscriptions already made from the token.
func (b *bench) connectAll(ctx context.Context, wg *sync.WaitGroup) error {
	limit := 64
	if b.cfg.herd {
		limit = b.cfg.subscribers
	}
	sem, gate := make(chan struct{}, limit), make(chan struct{})
	ready := make(chan error, b.cfg.subscribers)
	for i := range b.cfg.subscribers {
		wg.Go(func() {
			<-gate
			sem <- struct{}{}
			b.stream(ctx, i, func(err error) { <-sem; ready <- err })
		})
	}
	close(gate) // the herd: every goroutine is waiting here, now all go
	timeout := time.After(2 * time.Minute)
	for range b.cfg.subscribers {
		select {
		case err := <-ready:
			if err != nil {
				return err
			}
		case <-timeout:
			return errors.New("subscribers not all connected within 2m")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// push is the part of a Centrifugo JSON push frame this driver reads; a
// ping is the empty frame {}.
type push struct {
	Channel string `json:"channel"`
	Pub     *struct {
		Data struct {
			ID int `json:"id"`
		} `json:"data"`
	} `json:"pub"`
	Connect *struct {
		Subs map[string]json.RawMessage `json:"subs"`
	} `json:"connect"`
}

// stream holds subscriber i's stream, one push frame per line, and calls
// connected once: with nil when subscribed, or with why not.
func (b *bench) stream(ctx context.Context, i int, connected func(error)) {
	channel := "s" + strconv.Itoa(i)
	body, _ := json.Marshal(map[string]string{"token": b.token("u"+strconv.Itoa(i), channel)})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.base+"/connection/uni_http_stream", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		connected(fmt.Errorf("subscriber %d: %w", i, err))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		connected(fmt.Errorf("subscriber %d: status %s", i, resp.Status))
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 4096), 1<<20)
	waiting := true
	for sc.Scan() {
		at := time.Since(b.origin)
		var p push
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			fmt.Fprintf(os.Stderr, "subscriber %d: bad frame %q: %v\n", i, sc.Bytes(), err)
			continue
		}
		switch {
		case waiting && p.Connect != nil:
			if _, ok := p.Connect.Subs[channel]; !ok {
				connected(fmt.Errorf("subscriber %d: not subscribed to %s: %s", i, channel, sc.Bytes()))
				return
			}
			waiting = false
			connected(nil)
		case p.Pub != nil:
			id := p.Pub.Data.ID
			if p.Channel != channel || id < 0 || id >= len(b.target) || b.target[id] != i {
				b.stray.Add(1)
			} else if b.count[id].Add(1) == 1 {
				b.recvAt[id].Store(int64(at))
			}
		}
	}
	if waiting {
		connected(fmt.Errorf("subscriber %d: stream ended before its connect frame: %v", i, sc.Err()))
	} else if ctx.Err() == nil { // its undelivered publishes count as lost
		fmt.Fprintf(os.Stderr, "subscriber %d: stream ended early: %v\n", i, sc.Err())
	}
}

// token is an HS256 connection JWT for user sub, subscribed to channel.
// It has no exp claim, so it never expires during the run.
func (b *bench) token(sub, channel string) string {
	enc := base64.RawURLEncoding
	claims, _ := json.Marshal(map[string]any{"sub": sub, "channels": []string{channel}})
	s := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc.EncodeToString(claims)
	m := hmac.New(sha256.New, b.secret)
	m.Write([]byte(s))
	return s + "." + enc.EncodeToString(m.Sum(nil))
}

// publishAll sends publish i at start + i/rate, each in a goroutine of its
// own, never waiting for one before the next: a slow server cannot lower
// the offered load. It returns when every publish has been answered.
func (b *bench) publishAll(ctx context.Context, start time.Time, n int) {
	sem := make(chan struct{}, publishLimit)
	var wg sync.WaitGroup
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) * float64(time.Second) / b.cfg.rate))))
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			b.started[i] = time.Now()
			b.accepted[i] = b.publish(ctx, i) == nil
		})
	}
	wg.Wait()
}

// pad fills each publication's data to 256 bytes.
var pad = strings.Repeat("x", 256)

func (b *bench) publish(ctx context.Context, id int) error {
	data := fmt.Sprintf(`{"id":%d,"pad":"`, id)
	data += pad[:256-len(data)-2] + `"}`
	body := fmt.Sprintf(`{"channel":"s%d","data":%s}`, b.target[id], data)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.base+"/api/publish", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", b.apiKey)
	resp, err := b.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// The API answers 200 with either {"result":...} or {"error":...}.
	var out struct {
		Error json.RawMessage `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.Error != nil {
		err = fmt.Errorf("publish %d: %s %s %v", id, resp.Status, out.Error, err)
		fmt.Fprintln(os.Stderr, err)
		return err
	}
	return nil
}

// owed counts accepted publishes not yet delivered; it runs only once every
// publish has been answered.
func (b *bench) owed() int {
	n := 0
	for i := range b.accepted {
		if b.accepted[i] && b.count[i].Load() == 0 {
			n++
		}
	}
	return n
}

// procStats is the process's user+system CPU seconds and its peak RSS in
// bytes (VmHWM).
func procStats(pid int) (cpu float64, hwm int64, err error) {
	t, err1 := procstat.CPUTime(pid)
	hwm, err2 := procstat.PeakRSS(pid)
	// Whole ticks of 10 ms: the quotient is the same float as ticks/100.
	return float64(t) / float64(time.Second), hwm, errors.Join(err1, err2)
}

func raiseNoFile(need int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Max < uint64(need) {
		return fmt.Errorf("RLIMIT_NOFILE hard limit %d is below the %d descriptors needed", lim.Max, need)
	}
	lim.Cur = lim.Max
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// percentileMS is the exact nearest-rank q-quantile of sorted d, in ms.
func percentileMS(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	k := max(0, int(math.Ceil(float64(len(d))*q))-1)
	return round(float64(d[k])/float64(time.Millisecond), 3)
}

func round(v float64, places int) float64 {
	p := math.Pow10(places)
	return math.Round(v*p) / p
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tail is the end of a log file, for an error message.
func tail(path string) string {
	data, _ := os.ReadFile(path)
	return string(data[max(0, len(data)-2048):])
}
