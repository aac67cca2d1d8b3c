package objects

import (
	"os"
	"testing"

	"loam.dev/loam/internal/objects/s3test"
)

func TestMain(m *testing.M) { os.Exit(s3test.Around(m.Run)) }

// TestS3Store: the suite on a real S3 server (versitygw), each test a
// bucket of its own, under a prefix.
func TestS3Store(t *testing.T) {
	runSuite(t, func(t *testing.T) *Store {
		s, err := Open(t.Context(), s3test.NewBucket(t, "loam/"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
