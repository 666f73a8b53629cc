package test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/recordings"
)

// TestRelayStoreComesBack: a relay (a replica standing by) whose
// artifact store does not answer when it starts leaves actions and
// screenshots to the leader (RelayUsable says no for them; yes for
// preview connections, the control), and carries them itself once the
// store answers again, within a few of its checks: a MinIO that was
// down when a replica started no longer costs it them for its life.
func TestRelayStoreComesBack(t *testing.T) {
	e := needE2E(t)
	back := e.minioAway(t)
	store, err := recordings.Open(recordings.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret", Bucket: "sandgate-artifacts"})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	u, _ := url.Parse("http://gw.test:8080")
	relay, err := gateway.NewRelay(gateway.Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, "relay-test",
		func(context.Context) (string, error) { return "", nil }, nil, store, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer relay.App().Shutdown()
	actions := gateway.Relays{Actions: true}
	waitFor(t, 30*time.Second, "the relay to find the store not answering", func() bool {
		return strings.Contains(logs.String(), "the artifact store does not answer")
	})
	if relay.RelayUsable(actions) || !relay.RelayUsable(gateway.Relays{Previews: true}) {
		t.Fatalf("MinIO down: usable for actions %v (want false), for previews %v (want true)", relay.RelayUsable(actions), relay.RelayUsable(gateway.Relays{Previews: true}))
	}
	back()
	t0 := time.Now()
	waitFor(t, time.Minute, "the relay to take actions and screenshots once the store answers", func() bool { return relay.RelayUsable(actions) })
	t.Logf("usable for actions %.1f s after MinIO came back", time.Since(t0).Seconds())
	if !strings.Contains(logs.String(), "the artifact store answers again") {
		t.Error("the relay's log does not say the store answers again")
	}
}
