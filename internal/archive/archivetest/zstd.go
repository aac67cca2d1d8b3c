package archivetest

import (
	"bytes"
	"io"

	"github.com/klauspost/compress/zstd"
)

// Unzstd is the whole of zstd stream b, decoded and its checksum checked,
// or nil when it does not decode whole: what a test compares a damaged
// archive's content by.
func Unzstd(b []byte) []byte {
	zr, err := zstd.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	defer zr.Close()
	out, err := io.ReadAll(zr)
	if err != nil {
		return nil
	}
	return out
}
