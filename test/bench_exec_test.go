package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"testing"
	"time"
)

// ctrExec runs a command in the session with containerd's own CLI: the
// baseline without the gateway.
func ctrExec(b *testing.B, id string, stdout io.Writer, args ...string) {
	b.Helper()
	cmd := exec.Command("ctr", append([]string{"-n", testNamespace, "task", "exec", "--exec-id", "bench-" + randHex(6), "--user", "1000", id}, args...)...)
	if stdout == nil {
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("ctr exec: %v %s", err, out)
		}
		return
	}
	cmd.Stdout = stdout
	if err := cmd.Run(); err != nil {
		b.Fatalf("ctr exec: %v", err)
	}
}

// apiExecBytes runs a command through the API and returns its stdout bytes.
func (e *testEnv) apiExecBytes(b *testing.B, id string, args ...string) int {
	raw, _ := json.Marshal(map[string]any{"cmd": args})
	req, _ := http.NewRequest("POST", e.gwURL+"/v1/sessions/"+id+"/exec", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var r struct {
			Data     []byte `json:"data"`
			ExitCode *int   `json:"exit_code"`
		}
		json.Unmarshal(sc.Bytes(), &r)
		n += len(r.Data)
		if r.ExitCode != nil && *r.ExitCode != 0 {
			b.Fatalf("exit %d", *r.ExitCode)
		}
	}
	return n
}

// BenchmarkExec: the round trip of `true` through the API beside `ctr task
// exec` of the same command, and stdout throughput of 64 MB both ways.
func BenchmarkExec(b *testing.B) {
	e := needE2E(b)
	s := e.createSession(b, e.keyA, nil)
	var api, ctr []time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		e.apiExecBytes(b, s.ID, "true")
		api = append(api, time.Since(t0))
		t1 := time.Now()
		ctrExec(b, s.ID, nil, "true")
		ctr = append(ctr, time.Since(t1))
	}
	const size = 64 << 20
	t0 := time.Now()
	if n := e.apiExecBytes(b, s.ID, "head", "-c", fmt.Sprint(size), "/dev/zero"); n != size {
		b.Fatalf("api stdout: %d bytes", n)
	}
	apiMBs := size / time.Since(t0).Seconds() / 1e6
	var cw countWriter
	t1 := time.Now()
	ctrExec(b, s.ID, &cw, "head", "-c", fmt.Sprint(size), "/dev/zero")
	ctrMBs := float64(cw) / time.Since(t1).Seconds() / 1e6
	if cw != size {
		b.Fatalf("ctr stdout: %d bytes", cw)
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(percentile(api, 0.5)), "api-true-p50-ms")
	b.ReportMetric(ms(percentile(ctr, 0.5)), "ctr-true-p50-ms")
	b.ReportMetric(float64(percentile(api, 0.5))/float64(percentile(ctr, 0.5)), "true-api/ctr")
	b.ReportMetric(apiMBs, "api-stdout-MB/s")
	b.ReportMetric(ctrMBs, "ctr-stdout-MB/s")
	b.ReportMetric(apiMBs/ctrMBs, "stdout-api/ctr")
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }
