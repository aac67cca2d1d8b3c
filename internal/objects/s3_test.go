package objects

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

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

// TestS3AbortUploads: a multipart upload of a blob left unfinished (its
// node killed part-way) is aborted by Sweep once older than the grace, and
// one of another prefix is left alone.
func TestS3AbortUploads(t *testing.T) {
	ctx := t.Context()
	raw := s3test.NewBucket(t, "loam/")
	s, err := Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := s3test.Shared(t).Client()
	bucket := aws.String(s.bucket)
	begin := func(key string) {
		t.Helper()
		up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: bucket, Key: aws.String(key)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: bucket, Key: aws.String(key), UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader(strings.Repeat("x", 1<<20))}); err != nil {
			t.Fatal(err)
		}
	}
	begin("loam/" + blobsPrefix + strings.Repeat("ab", 32))
	begin("other/" + blobsPrefix + strings.Repeat("cd", 32))
	left := func() []string {
		t.Helper()
		out, err := c.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: bucket})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, u := range out.Uploads {
			keys = append(keys, aws.ToString(u.Key))
		}
		return keys
	}
	if n, err := s.Sweep(ctx, time.Hour); err != nil || n != 0 || len(left()) != 2 {
		t.Fatalf("Sweep within the grace: %d, %v, uploads left %v; want none aborted", n, err, left())
	}
	if n, err := s.Sweep(ctx, -time.Minute); err != nil || n != 1 {
		t.Errorf("Sweep: %d, %v; want the unfinished upload aborted", n, err)
	}
	if got := left(); len(got) != 1 || !strings.HasPrefix(got[0], "other/") {
		t.Errorf("uploads left after Sweep: %v; want only the other prefix's", got)
	}
}
