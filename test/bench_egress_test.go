package test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	cdpc "github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/security"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/sandgate/sandgate/egress"
)

// benchPolicy gives every loopback client the same policy: the pages over
// HTTP, one HTTPS site tunnelled and one intercepted with a credential.
type benchPolicy struct{ p egress.Policy }

func (b benchPolicy) Policy(netip.Addr) (egress.Policy, bool) { return b.p, true }

type benchSecret struct{}

func (benchSecret) Credential(context.Context, string, string) (egress.Credential, error) {
	return egress.Credential{Kind: egress.KindHeader, Name: "X-Bench-Token", Secret: "bench-token"}, nil
}

func (benchSecret) Placeholder(string, string) string { return "" }

// BenchmarkEgressPageLoad: page loads in host Chromium through the egress
// proxy (the same code the gateway runs) and with the proxy bypassed, in
// one run: plain HTTP, HTTPS tunnelled, HTTPS intercepted with a
// credential added. Cache off; connections are kept alive, as in a session.
func BenchmarkEgressPageLoad(b *testing.B) {
	e := needE2E(b)
	static := map[string][]netip.Addr{}
	for n, as := range testHostNames {
		for _, a := range as {
			static[n] = append(static[n], netip.MustParseAddr(a))
		}
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	allow := []egress.Pattern{}
	for _, a := range []string{"pages.sandgate.test:80", "site.sandgate.test:443"} {
		p, _ := egress.ParsePattern(a)
		allow = append(allow, p)
	}
	bind := egress.Binding{Credential: "cred_0000000000000001", Scheme: "https", Host: "intercepted.sandgate.test"}
	if err := egress.CheckBinding(&bind); err != nil {
		b.Fatal(err)
	}
	proxy := egress.New(egress.Config{Resolver: egress.NewResolver("", static), UpstreamRoots: e.hosts.caPool, CASecret: secret},
		benchPolicy{egress.Policy{Session: "bench", Tenant: "bench", Allow: allow, Bindings: []egress.Binding{bind}}}, benchSecret{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go proxy.Serve(l)
	defer proxy.Close()

	open := func(display int, extra ...string) context.Context {
		port, _ := freePort()
		stop := hostChromium(b, display, port, extra...)
		b.Cleanup(stop)
		ctx, cancel := context.WithCancel(context.Background())
		b.Cleanup(cancel)
		actx, _ := remote.NewAllocator(ctx, fmt.Sprintf("http://127.0.0.1:%d", port))
		cctx, _ := chromedp.NewContext(actx)
		err := chromedp.Do(cctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if _, err := cdpc.Call(ctx, t, security.SetIgnoreCertificateErrors, security.SetIgnoreCertificateErrorsParams{Ignore: true}); err != nil {
				return err
			}
			_, err := cdpc.Call(ctx, t, network.SetCacheDisabled, network.SetCacheDisabledParams{CacheDisabled: true})
			return err
		}))
		if err != nil {
			b.Fatal(err)
		}
		return cctx
	}
	direct := open(95, "--host-resolver-rules=MAP *.sandgate.test "+sitesIP)
	proxied := open(96, "--proxy-server=http://"+l.Addr().String())

	cases := []struct {
		name, url, want string
	}{
		{"http", "http://pages.sandgate.test/hello.html", "Sandgate test page"},
		{"https-tunnel", "https://site.sandgate.test/", "allowed site"},
		{"https-intercept", "https://intercepted.sandgate.test/", "allowed site"},
	}
	times := map[string][]time.Duration{}
	load := func(ctx context.Context, key, url, want string) {
		t0 := time.Now()
		title, err := navigateTitle(ctx, url)
		if err != nil || title != want {
			b.Fatalf("%s %s: %q, %v", key, url, title, err)
		}
		times[key] = append(times[key], time.Since(t0))
	}
	// Warm both: connections, and the intercepted host's certificate.
	for _, c := range cases {
		load(direct, "warm", c.url, c.want)
		load(proxied, "warm", c.url, c.want)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, c := range cases {
			load(direct, c.name+"/direct", c.url, c.want)
			load(proxied, c.name+"/proxy", c.url, c.want)
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, c := range cases {
		d, p := percentile(times[c.name+"/direct"], 0.5), percentile(times[c.name+"/proxy"], 0.5)
		b.ReportMetric(ms(d), c.name+"-direct-p50-ms")
		b.ReportMetric(ms(p), c.name+"-proxy-p50-ms")
		b.ReportMetric(float64(p)/float64(d), c.name+"-ratio")
	}
}
