// Package bucket makes sure an object store's bucket is there: the
// artifact store, the profiles and the vault each keep one.
package bucket

import (
	"context"
	"fmt"

	"github.com/minio/minio-go/v7"
)

// Ensure creates the bucket if it is missing. Replicas starting together
// race to create it: one that loses is told the bucket is already its
// own (BucketAlreadyOwnedByYou), which is not an error. A bucket that
// exists but is someone else's (BucketAlreadyExists) is.
func Ensure(ctx context.Context, c *minio.Client, endpoint, name string) error {
	ok, err := c.BucketExists(ctx, name)
	if err != nil {
		return fmt.Errorf("minio at %s: %w", endpoint, err)
	}
	if ok {
		return nil
	}
	if err := c.MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		if minio.ToErrorResponse(err).Code == "BucketAlreadyOwnedByYou" {
			return nil
		}
		return fmt.Errorf("create bucket %s: %w", name, err)
	}
	return nil
}
