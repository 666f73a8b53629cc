// Command failures reads `go test -json` on its input, prints the output as
// `go test -v` would while the tests run, and at the end repeats the output
// of every test that failed, then the lines each one's own code wrote. A CI
// log kept only by its tail (where the suite's end prints the gateway's and
// MinIO's logs, and a failed test its replicas') then still says which test
// failed and why. It exits 1 when a test or a package failed, or when
// the input ended without a package's result (a build failure, a crash).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// event is the part of test2json's event used here.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// Bounds on what the summary repeats, so one chatty test cannot push the
// others out of the log's tail.
const (
	maxLinesPerTest = 120
	maxTestsShown   = 12
	maxSaidPerTest  = 15
)

// said matches a line the test's own code wrote (t.Log, t.Error, t.Fatal:
// indented, then file:line), not the lines of a log it printed.
var said = regexp.MustCompile(`^\s+[\w./-]+\.go:\d+: `)

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

func run(in io.Reader, out io.Writer) int {
	outputs := map[string][]string{} // test name -> its output lines
	var failed []string              // tests in the order they failed
	packages, failedPackages := 0, 0
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not an event: pass it on
			continue
		}
		switch e.Action {
		case "output", "build-output":
			fmt.Fprint(out, e.Output)
			if e.Test != "" {
				outputs[e.Test] = append(outputs[e.Test], e.Output)
			}
		case "fail":
			if e.Test != "" {
				failed = append(failed, e.Test)
			} else {
				packages++
				failedPackages++
			}
		case "pass", "skip":
			if e.Test == "" {
				packages++
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "failures: reading the test output: %v\n", err)
		return 1
	}
	if len(failed) > 0 {
		fmt.Fprintf(out, "\n==== %d failed test(s): %s\n", len(failed), strings.Join(failed, ", "))
		for i, name := range failed {
			if i == maxTestsShown {
				fmt.Fprintf(out, "==== (%d more not repeated)\n", len(failed)-i)
				break
			}
			lines := outputs[name]
			repeat(out, name, "lines of output", lines, maxLinesPerTest)
		}
		// Last, what each failed test's code said: a test that prints
		// logs as it fails (its gateways') puts its reason above them,
		// out of a short tail.
		for i, name := range failed {
			if i == maxTestsShown {
				break
			}
			var own []string
			for _, l := range outputs[name] {
				if said.MatchString(l) {
					own = append(own, l)
				}
			}
			repeat(out, name+": what its code said", "lines", own, maxSaidPerTest)
		}
	}
	switch {
	case packages == 0:
		fmt.Fprintln(out, "failures: no package reported a result (did the build fail?)")
		return 1
	case failedPackages > 0 || len(failed) > 0:
		return 1
	}
	return 0
}

// repeat prints a heading (title, how many lines there are, and the
// bound if they are more than most), then the last most of lines.
func repeat(out io.Writer, title, what string, lines []string, most int) {
	fmt.Fprintf(out, "==== %s (%d %s", title, len(lines), what)
	if len(lines) > most {
		fmt.Fprintf(out, ", the last %d", most)
		lines = lines[len(lines)-most:]
	}
	fmt.Fprintln(out, ")")
	for _, l := range lines {
		fmt.Fprint(out, l)
	}
}
