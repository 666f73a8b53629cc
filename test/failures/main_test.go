package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	const passing = `{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p"}
`
	const failing = `{"Action":"output","Package":"p","Test":"TestB","Output":"=== RUN   TestB\n"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: the reason\n"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Output":"---- minio.log ----\n"}
{"Action":"fail","Package":"p"}
`
	// TestC fails, then prints a log longer than what is repeated of it.
	dumping := `{"Action":"output","Package":"p","Test":"TestC","Output":"=== RUN   TestC\n"}
{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:7: the reason\n"}
{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:8: replica B's log:\n"}
` + strings.Repeat(`{"Action":"output","Package":"p","Test":"TestC","Output":"        time=2026-12-06T22:30:10Z level=INFO msg=\"a line of the log\" at=x.go:1: y\n"}
`, 2*maxLinesPerTest) + `{"Action":"fail","Package":"p","Test":"TestC"}
{"Action":"fail","Package":"p"}
`
	for _, tc := range []struct {
		name, in string
		code     int
		tail     string
	}{
		{"pass", passing, 0, "=== RUN   TestA\n"},
		{"fail repeats the reason last", passing + failing, 1, "==== TestB (2 lines of output)\n=== RUN   TestB\n    b_test.go:9: the reason\n" +
			"==== TestB: what its code said (1 lines)\n    b_test.go:9: the reason\n"},
		{"the reason under a long log", passing + dumping, 1, "==== TestC: what its code said (2 lines)\n    c_test.go:7: the reason\n    c_test.go:8: replica B's log:\n"},
		{"no result", "# p\nbuild failed\n", 1, "did the build fail?)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if code := run(strings.NewReader(tc.in), &out); code != tc.code {
				t.Errorf("exit %d, want %d; printed:\n%s", code, tc.code, out.String())
			}
			if !strings.HasSuffix(out.String(), tc.tail) {
				t.Errorf("the output does not end with %q:\n%s", tc.tail, out.String())
			}
		})
	}
}
