package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
)

// TestArtifactUpdateRace: two writers adding to one stored log at once
// (two gateway replicas, as a takeover can make them) both keep their
// line. The race is made exact: one writer's change waits, between its
// read and its write, while the other reads and writes. The control is
// the same race through plain read-then-put, which loses the second
// line, so the race is real and the condition is what keeps it.
func TestArtifactUpdateRace(t *testing.T) {
	e := needE2E(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, err := recordings.New(ctx, recordings.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret", Bucket: "sandgate-update-test"})
	if err != nil {
		t.Fatal(err)
	}
	session := ids.NewSession()
	artifact := func(name string) recordings.Artifact {
		id := recordings.SegmentID(session, name)
		t.Cleanup(func() { store.Delete(context.Background(), "race", id) })
		return recordings.Artifact{ID: recordings.SegmentID(session, name), Session: session,
			Kind: recordings.KindLog, Name: name, ContentType: "application/x-ndjson"}
	}
	add := func(line string) func([]byte) ([]byte, bool) {
		return func(old []byte) ([]byte, bool) { return append(bytes.Clone(old), line+"\n"...), true }
	}
	read := func(a recordings.Artifact) string {
		var out bytes.Buffer
		if err := store.Fetch(ctx, "race", a.ID, &out); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}

	// Update, raced: the first writer's change runs the second writer
	// whole before it returns its own bytes.
	a := artifact("update.jsonl")
	if err := store.Update(ctx, "race", a, 1<<20, add("start")); err != nil {
		t.Fatal(err)
	}
	first := 0
	err = store.Update(ctx, "race", a, 1<<20, func(old []byte) ([]byte, bool) {
		first++
		if first == 1 {
			if err := store.Update(ctx, "race", a, 1<<20, add("second")); err != nil {
				t.Errorf("the second writer: %v", err)
			}
		}
		return add("first")(old)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := read(a), "start\nsecond\nfirst\n"; got != want || first != 2 {
		t.Errorf("raced updates stored %q after %d reads; want %q after 2 (the loser reads again)", got, first, want)
	}
	// A first write races too: of two that find no log, one creates it.
	b := artifact("create.jsonl")
	first = 0
	err = store.Update(ctx, "race", b, 1<<20, func(old []byte) ([]byte, bool) {
		first++
		if first == 1 {
			if err := store.Update(ctx, "race", b, 1<<20, add("second")); err != nil {
				t.Errorf("the second writer: %v", err)
			}
		}
		return add("first")(old)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := read(b), "second\nfirst\n"; got != want {
		t.Errorf("raced creates stored %q; want %q", got, want)
	}
	// A change that returns false writes nothing.
	if err := store.Update(ctx, "race", b, 1<<20, func([]byte) ([]byte, bool) { return []byte("gone\n"), false }); err != nil {
		t.Fatal(err)
	}
	if got := read(b); got != "second\nfirst\n" {
		t.Errorf("a change that declined wrote: %q", got)
	}
	// Past the bound it is read within: refused, not cut.
	if err := store.Update(ctx, "race", b, 4, add("x")); !errors.Is(err, recordings.ErrTooLarge) {
		t.Errorf("an update of a log over its bound: %v, want ErrTooLarge", err)
	}

	// Writers at once, unarranged: each line written is kept once, and
	// no writer fails for a write that came during its read (the read is
	// one GET: a HEAD before it, as minio-go's Object makes, failed the
	// GET that asked for the HEAD's ETag when a write came between). A
	// writer may run out of tries when others keep winning (ErrChanged,
	// its line not written); that is allowed here, and counted.
	written, exhausted := 0, 0
	for round := 0; round < 3; round++ {
		m := artifact(fmt.Sprintf("many-%d.jsonl", round))
		var wg sync.WaitGroup
		var mu sync.Mutex
		var want []string
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 5; i++ {
					line := fmt.Sprintf("w%d-%d", w, i)
					err := store.Update(ctx, "race", m, 1<<20, add(line))
					mu.Lock()
					switch {
					case err == nil:
						want = append(want, line)
					case errors.Is(err, recordings.ErrChanged):
						exhausted++
					default:
						t.Errorf("round %d: a writer among four: %v", round, err)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		written += len(want)
		lines := strings.Split(strings.TrimSpace(read(m)), "\n")
		if fmt.Sprint(slices.Sorted(slices.Values(lines))) != fmt.Sprint(slices.Sorted(slices.Values(want))) {
			t.Errorf("round %d: four writers stored %q, want each of %q once", round, lines, want)
		}
	}
	if written < 30 {
		t.Errorf("%d of 60 lines written (%d writers ran out of tries)", written, exhausted)
	}
	t.Logf("four writers at once, three rounds: %d of 60 lines written, %d ran out of tries", written, exhausted)

	// Control: the same race through a plain read and put loses the
	// second writer's line.
	c := artifact("plain.jsonl")
	plain := func(change func([]byte) ([]byte, bool), between func()) {
		var old bytes.Buffer
		if err := store.Fetch(ctx, "race", c.ID, &old); err != nil && !errors.Is(err, recordings.ErrNotFound) {
			t.Fatal(err)
		}
		between()
		data, _ := change(old.Bytes())
		if _, err := store.PutFrom(ctx, "race", c, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	plain(add("start"), func() {})
	plain(add("first"), func() { plain(add("second"), func() {}) })
	if got := read(c); got != "start\nfirst\n" {
		t.Errorf("control: plain read-then-put stored %q; the race should have lost %q", got, "second")
	}
}
