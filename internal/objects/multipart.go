package objects

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// abortUploads aborts the S3 multipart uploads of blobs begun before grace
// ago, and returns how many. A node killed part-way through a large blob's
// upload leaves one behind: no object, so Sweep's listing never sees it,
// but the server keeps (and bills) its parts until it is aborted. A store
// that is not S3 has none. gocloud.dev/blob has no portable call for
// this, so it goes to the S3 client under the bucket (Bucket.As).
func (s *Store) abortUploads(ctx context.Context, grace time.Duration) (int, error) {
	var c *s3.Client
	if s.bucket == "" || !s.b.As(&c) {
		return 0, nil
	}
	cutoff := time.Now().Add(-grace)
	in := &s3.ListMultipartUploadsInput{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix + blobsPrefix)}
	aborted := 0
	for {
		out, err := c.ListMultipartUploads(ctx, in)
		if err != nil {
			return aborted, fmt.Errorf("listing the unfinished uploads in %s: %w", s.where, err)
		}
		for _, u := range out.Uploads {
			if u.Initiated != nil && u.Initiated.After(cutoff) {
				continue // may be an upload going on now
			}
			if _, err := c.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(s.bucket), Key: u.Key, UploadId: u.UploadId}); err != nil {
				return aborted, fmt.Errorf("aborting an unfinished upload of %s in %s: %w", aws.ToString(u.Key), s.where, err)
			}
			aborted++
		}
		if !aws.ToBool(out.IsTruncated) {
			return aborted, nil
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
}
