package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// floodScript opens 200 connections to the egress proxy from inside the
// session, asks each for an allowed page and counts the answers: 200 from
// the admitted ones, 429 (or a closed connection) from the refused. It
// then holds every connection open until /tmp/sg-release exists (at most
// 120 s), so the test can look at the gateway meanwhile.
const floodScript = `
use strict; use IO::Socket::INET;
$SIG{PIPE} = 'IGNORE';
my ($h, $p) = $ENV{SANDGATE_PROXY} =~ m{^http://([^:/]+):(\d+)} or die "no proxy";
my @s;
for (1..200) {
	my $c = IO::Socket::INET->new(PeerAddr => $h, PeerPort => $p, Timeout => 5);
	push @s, $c if $c;
}
my %n = (opened => scalar @s, ok => 0, limited => 0, closed => 0, other => 0);
for my $c (@s) {
	print $c "GET http://pages.sandgate.test/hello.html HTTP/1.1\r\nHost: pages.sandgate.test\r\n\r\n";
	my $l = <$c>;
	if (!defined $l) { $n{closed}++; next }
	if ($l =~ m{^HTTP/1\.1 200 }) {
		$n{ok}++;
		# Read the rest of the answer so the connection idles.
		my $len = 0;
		while (my $hl = <$c>) { $len = $1 if $hl =~ /^Content-Length:\s*(\d+)/i; last if $hl eq "\r\n" }
		read($c, my $body, $len);
	} elsif ($l =~ m{^HTTP/1\.1 429 }) { $n{limited}++ } else { $n{other}++ }
}
print join(" ", map { "$_=$n{$_}" } sort keys %n), "\n";
open(my $f, ">", "/tmp/sg-holding"); close $f;
for (1..1200) { last if -e "/tmp/sg-release"; select(undef, undef, undef, 0.1) }
`

// TestEgressLimits: a session that opens 200 connections to the egress
// proxy gets its limit (64) and 429s for the rest, audited once per
// burst, not once per connection; the gateway's open files grow by the
// limit, not by the flood; meanwhile another tenant's session is created
// and loads an allowed page, and the flooding session's own new
// connection is refused until it lets its connections go, when it loads
// the page again.
func TestEgressLimits(t *testing.T) {
	e := needE2E(t)
	if e.gw == nil || e.gw.Process == nil {
		t.Fatal("no gateway process")
	}
	pid := e.gw.Process.Pid
	s := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	sh := func(t *testing.T, key, id, script string) execOut {
		t.Helper()
		return e.execIn(t, key, id, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 60})
	}
	page := "curl -sS --max-time 20 -o /dev/null -w '%{http_code}' http://pages.sandgate.test/hello.html"
	// Control: the page loads, and the count of open files is stable
	// enough to compare with.
	if out := sh(t, e.keyA, s.ID, page); string(out.Stdout) != "200" {
		t.Fatalf("control: the page before the flood: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
	}
	before := openFiles(t, pid)

	type result struct {
		out execOut
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := execCollect(e, e.keyA, s.ID, map[string]any{"cmd": []string{"perl", "-e", floodScript}, "timeout_seconds": 180})
		done <- result{out, err}
	}()
	released := false
	release := func() {
		if !released {
			released = true
			sh(t, e.keyA, s.ID, "touch /tmp/sg-release")
		}
	}
	defer release()
	deadline := time.Now().Add(120 * time.Second)
	for sh(t, e.keyA, s.ID, "test -e /tmp/sg-holding").ExitCode != 0 {
		select {
		case r := <-done:
			t.Fatalf("the flood ended before holding: %v %q %q", r.err, r.out.Stdout, r.out.Stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the flood did not get its answers in 120 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	during := openFiles(t, pid)
	t.Logf("gateway open files: %d before the flood, %d while it holds its connections", before, during)
	// The session holds 64 connections (and the proxy at most a few idle
	// upstream ones); an unlimited proxy would hold 200 more files.
	if during-before > 64+40 {
		t.Errorf("the gateway's open files grew by %d during a flood of 200 connections; want about 64", during-before)
	}
	if during-before < 40 {
		t.Errorf("control: the gateway's open files grew by only %d while the session holds its connections", during-before)
	}

	t.Run("own-new-connection-refused", func(t *testing.T) {
		out := sh(t, e.keyA, s.ID, page)
		if string(out.Stdout) != "429" && string(out.Stdout) != "000" {
			t.Errorf("a new connection of the flooding session: %q %q, want 429", out.Stdout, out.Stderr)
		}
	})

	t.Run("another-session-works", func(t *testing.T) {
		other := e.createSession(t, e.keyB, map[string]any{"runtime": "runc"})
		if out := sh(t, e.keyB, other.ID, page); string(out.Stdout) != "200" {
			t.Errorf("another tenant's session during the flood: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
		}
	})

	release()
	r := <-done
	if r.err != nil {
		t.Fatalf("flood: %v", r.err)
	}
	t.Logf("flood: %s", bytes.TrimSpace(r.out.Stdout))
	counts := map[string]int{}
	for _, kv := range strings.Fields(string(r.out.Stdout)) {
		k, v, _ := strings.Cut(kv, "=")
		counts[k], _ = strconv.Atoi(v)
	}
	if counts["opened"] < 190 {
		t.Fatalf("the flood opened only %d connections: %q %q", counts["opened"], r.out.Stdout, r.out.Stderr)
	}
	if counts["ok"] < 50 || counts["ok"] > 64 {
		t.Errorf("%d connections were served; want up to the limit of 64 (and most of it)", counts["ok"])
	}
	if refused := counts["limited"] + counts["closed"]; refused < counts["opened"]-64 || counts["limited"] == 0 {
		t.Errorf("%d refused (%d with 429); want the %d past the limit", refused, counts["limited"], counts["opened"]-64)
	}

	t.Run("flooder-recovers", func(t *testing.T) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			out := sh(t, e.keyA, s.ID, page)
			if string(out.Stdout) == "200" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the session cannot load the page after releasing its connections: %q %q", out.Stdout, out.Stderr)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	t.Run("audited-per-burst", func(t *testing.T) {
		// The first refusal is recorded at once, the rest of the burst
		// as counts when its window (10 s) closes.
		floodRefused := counts["limited"] + counts["closed"]
		var limited []map[string]any
		total := 0
		for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(time.Second) {
			limited, total = nil, 0
			for _, ev := range e.events(t, e.keyA, s.ID) {
				if ev.Type == "egress_limited" {
					limited = append(limited, ev.Fields)
					n, _ := ev.Fields["refused"].(float64)
					total += int(n)
				}
			}
			if total >= floodRefused || time.Now().After(deadline) {
				break
			}
		}
		t.Logf("%d egress_limited events counting %d refusals", len(limited), total)
		if total < floodRefused {
			t.Errorf("the trail counts %d refusals; the flood had %d", total, floodRefused)
		}
		if len(limited) == 0 || len(limited) > 5 || !strings.Contains(fmt.Sprint(limited[0]["reason"]), "too many connections") {
			t.Errorf("egress_limited events: %v; want a few, one per burst window, not one per refusal", limited)
		}
	})
}

// openFiles counts a process's open file descriptors.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// execCollect is execIn for a goroutine: it returns its failure instead
// of failing the test.
func execCollect(e *testEnv, key, id string, req map[string]any) (execOut, error) {
	raw, _ := json.Marshal(req)
	hreq, _ := http.NewRequest("POST", e.gwURL+"/v1/sessions/"+id+"/exec", bytes.NewReader(raw))
	hreq.Header.Set("Authorization", "Bearer "+key)
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return execOut{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return execOut{}, fmt.Errorf("exec: %d", resp.StatusCode)
	}
	var out execOut
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var r execRec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return out, fmt.Errorf("record %q: %w", sc.Text(), err)
		}
		switch {
		case r.Stream == "stdout":
			out.Stdout = append(out.Stdout, r.Data...)
		case r.Stream == "stderr":
			out.Stderr = append(out.Stderr, r.Data...)
		case r.ExitCode != nil:
			out.ExitCode, out.TimedOut = *r.ExitCode, r.TimedOut
			return out, nil
		}
	}
	return out, fmt.Errorf("the exec stream ended without an exit code: %v", sc.Err())
}
