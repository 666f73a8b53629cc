package test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/vault"
)

// TestBucketCreateRace: gateway replicas that start together each
// create the buckets they find missing; those that lose the race find
// them made, and start. Eight at once, for each store, against the
// suite's MinIO. The controls: each bucket is there after, and a create
// that fails for another reason (a name MinIO refuses) is still an
// error.
func TestBucketCreateRace(t *testing.T) {
	e := needE2E(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := minio.New(e.minioAddr, &minio.Options{Creds: credentials.NewStaticV4("sandgate", "sandgate-test-secret", "")})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	stores := map[string]func(bucket string) error{
		"artifacts": func(bucket string) error {
			_, err := recordings.New(ctx, recordings.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret", Bucket: bucket})
			return err
		},
		"profiles": func(bucket string) error {
			_, err := profile.Open(ctx, profile.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret", Bucket: bucket, VaultKey: key})
			return err
		},
		"vault": func(bucket string) error {
			_, err := vault.Open(ctx, vault.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret", Bucket: bucket, Key: key})
			return err
		},
	}
	for name, open := range stores {
		bucket := "race-" + name + "-" + strings.ToLower(ids.NewSession()[2:12])
		t.Cleanup(func() { c.RemoveBucket(context.Background(), bucket) })
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		start := make(chan struct{})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := open(bucket); err != nil {
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		var failed []string
		for err := range errs {
			failed = append(failed, err.Error())
		}
		if len(failed) > 0 {
			t.Errorf("%s: %d of 8 starting together failed: %s", name, len(failed), strings.Join(failed, "; "))
		}
		if ok, err := c.BucketExists(ctx, bucket); !ok || err != nil {
			t.Errorf("%s: bucket %s after: %v, %v", name, bucket, ok, err)
		}
		if err := open("bad_bucket-" + name); err == nil || !strings.Contains(err.Error(), "bucket") {
			t.Errorf("%s: a bucket name MinIO refuses: %v, want the error", name, err)
		}
	}
}
