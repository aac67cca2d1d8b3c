package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/dustin/go-humanize"
	"github.com/klauspost/compress/zstd"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/archive"
	"loam.dev/loam/internal/disk"
)

// ErrBadLayer is wrapped by every error about a layer's content: an entry
// the unpacker refuses (an escape, an unknown type), or a corrupt archive.
var ErrBadLayer = errors.New("bad image layer")

// Unpacker applies layers, in order, onto a root directory. The content of
// an image is hostile input: every file operation goes through an
// archive.Dir, so no name and no symlink the layers make can reach outside
// the root, and an entry's last component is replaced, never followed.
//
// An Unpacker is for one root and one goroutine.
type Unpacker struct {
	root *archive.Dir
}

// NewUnpacker opens dir, which must exist, as the root to unpack into.
func NewUnpacker(dir string) (*Unpacker, error) {
	d, err := archive.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("opening %s to unpack into: %w", dir, err)
	}
	return &Unpacker{root: d}, nil
}

// Close releases the root.
func (u *Unpacker) Close() error { return u.root.Close() }

// ApplyCompressed applies one layer given as it is stored in a registry:
// gzip, zstd or plain tar, told apart by their magic numbers.
func (u *Unpacker) ApplyCompressed(ctx context.Context, r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadLayer, err)
		}
		defer gz.Close()
		return u.Apply(ctx, gz)
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadLayer, err)
		}
		defer zr.Close()
		return u.Apply(ctx, zr)
	default:
		return u.Apply(ctx, br)
	}
}

// Apply applies one uncompressed layer (a tar stream) onto the root,
// through the one safe extractor as an OCI layer (archive.Options.Layer):
// whiteouts delete, owners and set-id bits are kept, devices are skipped.
// The layer's files may not take the data dir's file system below its
// reserve (disk.ReserveBytes): neither a layer that expands a
// thousandfold nor a sparse file that reads back as a terabyte of zeros
// fills the disk every sandbox writes to.
func (u *Unpacker) Apply(ctx context.Context, r io.Reader) error {
	free, err := u.root.FreeBytes()
	if err != nil {
		return err
	}
	// At least one byte: 0 would mean no cap at all.
	maxBytes := max(free-disk.ReserveBytes, 1)
	err = archive.Extract(ctx, u.root, r, archive.Options{Layer: true, Owners: true, SetID: true, MaxBytes: maxBytes})
	var ee *archive.EntryError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, archive.ErrTooLarge):
		return api.Errorf(api.CodeInsufficientStorage, "not enough space in the data dir to unpack the image (%s free, %s kept in reserve): %s",
			humanize.IBytes(uint64(max(free, 0))), humanize.IBytes(disk.ReserveBytes), err)
	case errors.Is(err, archive.ErrRefused):
		return fmt.Errorf("%w: %w", ErrBadLayer, err)
	case errors.As(err, &ee):
		return fmt.Errorf("unpacking %s: %w", ee.Name, ee.Err)
	}
	return err
}
