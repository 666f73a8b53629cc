package test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/ids"
)

// BenchmarkTrailRead: what a replica taking a session over pays to read
// its audit trail back from MinIO, for a session whose trail was flushed
// at every request (2000 execs of about 280 bytes an event): stored one
// piece a flush, as the journal did, against pieces extended while under
// 16 KiB, as it does now. And what a flush costs to store: one event,
// against a piece of 8 KiB (the average one extended).
func BenchmarkTrailRead(b *testing.B) {
	e := needE2E(b)
	ctx := context.Background()
	store := e.benchStore(b)
	const events = 2000
	line := func(i int) []byte {
		return fmt.Appendf(nil, `{"time":"2026-12-02T10:00:00Z","type":"exec","fields":{"n":%d,"cmd":%q}}`+"\n", i, strings.Repeat("x", 200))
	}
	layouts := map[string]int{"one-piece-a-flush": 1, "extended-to-16KiB": 16 << 10}
	for _, name := range []string{"one-piece-a-flush", "extended-to-16KiB"} {
		limit := layouts[name]
		id := ids.NewSession()
		pieces, start := 0, 0
		var piece []byte
		put := func(at int) {
			if err := store.PutTrail(ctx, "bench", id, at, piece); err != nil {
				b.Fatal(err)
			}
			pieces++
		}
		for i := 0; i < events; i++ {
			l := line(i)
			if len(piece) > 0 && len(piece)+len(l) > limit {
				put(start)
				piece, start = nil, i
			}
			piece = append(piece, l...)
		}
		put(start)
		b.Cleanup(func() { store.DropTrail(context.Background(), "bench", id) })
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				n := 0
				err := store.ReadTrail(ctx, "bench", id, func(_ int, r io.Reader) error {
					raw, err := io.ReadAll(r)
					n += bytes.Count(raw, []byte("\n"))
					return err
				})
				if err != nil || n != events {
					b.Fatalf("read %d events of %d: %v", n, events, err)
				}
			}
			b.ReportMetric(float64(pieces), "pieces")
		})
	}
	for _, size := range []int{280, 8 << 10} {
		b.Run(fmt.Sprintf("put-%dB", size), func(b *testing.B) {
			id := ids.NewSession()
			b.Cleanup(func() { store.DropTrail(context.Background(), "bench", id) })
			piece := bytes.Repeat([]byte("x"), size)
			for i := 0; i < b.N; i++ {
				if err := store.PutTrail(ctx, "bench", id, 0, piece); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
