// Package objects keeps data off the node, in an object store: S3 or any
// S3-compatible server, and with them GCS, Azure Blob Storage and a shared
// file system (file://), through gocloud.dev/blob, so that the store is
// the user's choice and a URL (loam serve --objects).
//
// Data goes in content-addressed blobs (blobs/sha256/HEX): a blob's key is
// the SHA-256 of its bytes, checked on every read, so a partial or corrupt
// object is never taken for good data (ErrCorrupt), and the same bytes are
// stored once however many checkpoints hold them. What makes blobs a
// checkpoint (or a template, or a sleeping sandbox's image) is a manifest
// (manifests/NAME.json) naming them, written only once every blob it
// names is stored: a crash mid-upload leaves blobs no manifest names,
// which nothing takes for complete, and which Sweep removes.
package objects

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	// The schemes --objects takes: s3:// (and S3-compatible servers, with
	// endpoint=), file://.
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/s3blob"
)

// ErrCorrupt is wrapped by a read whose bytes are not the blob's: a size
// or a checksum that does not match its key.
var ErrCorrupt = errors.New("the object's bytes do not match its checksum")

// ErrNotFound is wrapped by a read of a blob or a manifest that is not
// there.
var ErrNotFound = errors.New("no such object")

// Key prefixes in the bucket (under the URL's prefix=, if any).
const (
	blobsPrefix     = "blobs/sha256/"
	manifestsPrefix = "manifests/"
)

// Store is an object store. It is safe for concurrent use.
type Store struct {
	b     *blob.Bucket
	where string // the URL without its query (which may hold secrets)
	// bucket and prefix, of an s3:// store, are its bucket's name and its
	// keys' prefix (prefix=), for the calls gocloud.dev/blob does not
	// make (abortUploads).
	bucket, prefix string
}

// Open opens the bucket rawURL names: s3://BUCKET?region=R&endpoint=URL
// (credentials from the usual AWS environment and files), or file:///DIR,
// with prefix=P to keep everything under P. It checks the bucket can be
// reached.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("opening the object store: %q is not a URL (s3://BUCKET?region=…, file:///DIR)", redact(rawURL))
	}
	where := u.Scheme + "://" + u.Host + u.Path
	b, err := blob.OpenBucket(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("opening the object store %s: %w", where, err)
	}
	s := &Store{b: b, where: where}
	if u.Scheme == "s3" {
		s.bucket, s.prefix = u.Host, u.Query().Get("prefix")
	}
	if _, err := b.IsAccessible(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("opening the object store %s: %w", where, err)
	}
	return s, nil
}

// redact is a URL for a message: its scheme, host and path.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Scheme + "://" + u.Host + u.Path
	}
	return "the URL given"
}

// String names the store for a log: its URL without the query.
func (s *Store) String() string { return s.where }

// Close lets go of the bucket.
func (s *Store) Close() error { return s.b.Close() }

// Blob is a stored blob: its digest ("sha256:HEX") and size.
type Blob struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// key is the bucket key of b, or an error for a digest that is not one
// (a manifest's, read back, is not trusted either).
func (b Blob) key() (string, error) {
	hexSum, ok := strings.CutPrefix(b.Digest, "sha256:")
	if !ok || len(hexSum) != 64 || strings.Trim(hexSum, "0123456789abcdef") != "" || b.Size < 0 {
		return "", fmt.Errorf("%w: %q is not a sha256 digest", ErrCorrupt, b.Digest)
	}
	return blobsPrefix + hexSum, nil
}

// PutFile stores the file at path as a blob, unless a blob of the same
// bytes is there already; progress, when set, is told the bytes uploaded
// as they go.
func (s *Store) PutFile(ctx context.Context, path string, progress func(int64)) (Blob, error) {
	f, err := os.Open(path)
	if err != nil {
		return Blob{}, fmt.Errorf("storing %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return Blob{}, fmt.Errorf("storing %s: %w", path, err)
	}
	b := Blob{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: size}
	key, _ := b.key()
	if attrs, err := s.b.Attributes(ctx, key); err == nil && attrs.Size == size {
		if progress != nil {
			progress(size)
		}
		return b, nil // stored already (by another checkpoint of the same bytes)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Blob{}, fmt.Errorf("storing %s: %w", path, err)
	}
	// The file may change under the upload (it should not: it is a
	// finished checkpoint's): the bytes sent are hashed again, and a
	// blob that is not what its key says is deleted, not kept.
	check := sha256.New()
	var src io.Reader = io.TeeReader(f, check)
	if progress != nil {
		src = &counting{r: src, progress: progress}
	}
	if err := s.b.Upload(ctx, key, src, &blob.WriterOptions{ContentType: "application/octet-stream"}); err != nil {
		return Blob{}, fmt.Errorf("storing %s in %s: %w", path, s.where, err)
	}
	if got := "sha256:" + hex.EncodeToString(check.Sum(nil)); got != b.Digest {
		_ = s.b.Delete(context.WithoutCancel(ctx), key)
		return Blob{}, fmt.Errorf("storing %s: it changed while it was uploaded", path)
	}
	return b, nil
}

// Has reports whether blob b is stored, whole (by its size).
func (s *Store) Has(ctx context.Context, b Blob) (bool, error) {
	key, err := b.key()
	if err != nil {
		return false, err
	}
	attrs, err := s.b.Attributes(ctx, key)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking for %s in %s: %w", b.Digest, s.where, err)
	}
	return attrs.Size == b.Size, nil
}

// counting tells progress of the bytes read through it.
type counting struct {
	r        io.Reader
	n        int64
	progress func(int64)
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n += int64(n)
		c.progress(c.n)
	}
	return n, err
}

// Open reads blob b; the reader's last Read answers ErrCorrupt instead of
// io.EOF when the bytes read are not b's (and as soon as there are more
// than its size).
func (s *Store) Open(ctx context.Context, b Blob) (io.ReadCloser, error) {
	key, err := b.key()
	if err != nil {
		return nil, err
	}
	r, err := s.b.NewReader(ctx, key, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("reading %s from %s: %w", b.Digest, s.where, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s from %s: %w", b.Digest, s.where, err)
	}
	return &verifying{r: r, want: b, h: sha256.New()}, nil
}

// verifying checks what it reads against a blob's size and digest.
type verifying struct {
	r    io.ReadCloser
	want Blob
	h    hash.Hash
	n    int64
}

func (v *verifying) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.n > v.want.Size {
		return n, fmt.Errorf("%w: %s is longer than its %d bytes", ErrCorrupt, v.want.Digest, v.want.Size)
	}
	if errors.Is(err, io.EOF) {
		if got := "sha256:" + hex.EncodeToString(v.h.Sum(nil)); v.n != v.want.Size || got != v.want.Digest {
			return n, fmt.Errorf("%w: %s read as %d bytes of %s", ErrCorrupt, v.want.Digest, v.n, got)
		}
	}
	return n, err
}

func (v *verifying) Close() error { return v.r.Close() }

// Fetch writes blob b to the file at path: into a file of its own beside
// it first, renamed to path only once all of it is there and checked, so
// that path is never a partial or corrupt copy.
func (s *Store) Fetch(ctx context.Context, b Blob, path string) error {
	r, err := s.Open(ctx, b)
	if err != nil {
		return err
	}
	defer r.Close()
	tmp := path + ".part-" + randomHex(6)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", b.Digest, err)
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("fetching %s to %s: %w", b.Digest, path, err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Manifest says what blobs make one thing stored (a checkpoint, say):
// its files by their paths (relative, slash-separated), and the caller's
// own description of it (Meta).
type Manifest struct {
	Files   map[string]Blob `json:"files"`
	Meta    json.RawMessage `json:"meta,omitempty"`
	Created time.Time       `json:"created"`
}

// Size is the bytes of all of m's files.
func (m *Manifest) Size() int64 {
	var n int64
	for _, b := range m.Files {
		n += b.Size
	}
	return n
}

// CheckName refuses a manifest name that is not a plain relative key:
// segments of letters, digits, '.', '_' and '-', joined by '/'.
func CheckName(name string) error {
	if name == "" || len(name) > 512 || path.Clean(name) != name || strings.HasPrefix(name, "/") {
		return fmt.Errorf("manifest name %q: not a clean relative name", name)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "." || seg == ".." || strings.Trim(seg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
			return fmt.Errorf("manifest name %q: segment %q", name, seg)
		}
	}
	return nil
}

// PutManifest stores m under name. Call it once every blob m names is
// stored: from then on, m is there, complete.
func (s *Store) PutManifest(ctx context.Context, name string, m *Manifest) error {
	if err := CheckName(name); err != nil {
		return err
	}
	for p, b := range m.Files {
		if _, err := b.key(); err != nil {
			return fmt.Errorf("manifest %s: file %s: %w", name, p, err)
		}
	}
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := s.b.WriteAll(ctx, manifestsPrefix+name+".json", body, &blob.WriterOptions{ContentType: "application/json"}); err != nil {
		return fmt.Errorf("storing manifest %s in %s: %w", name, s.where, err)
	}
	return nil
}

// GetManifest reads the manifest stored under name; ErrNotFound if none.
func (s *Store) GetManifest(ctx context.Context, name string) (*Manifest, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	body, err := s.b.ReadAll(ctx, manifestsPrefix+name+".json")
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("manifest %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading manifest %s from %s: %w", name, s.where, err)
	}
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w: %v", name, ErrCorrupt, err)
	}
	for p, b := range m.Files {
		if _, err := b.key(); err != nil || !localPath(p) {
			return nil, fmt.Errorf("manifest %s: file %q: %w", name, p, ErrCorrupt)
		}
	}
	return &m, nil
}

// DeleteManifest deletes the manifest under name (gone already is no
// error). Its blobs stay until Sweep finds no other manifest names them.
func (s *Store) DeleteManifest(ctx context.Context, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	err := s.b.Delete(ctx, manifestsPrefix+name+".json")
	if err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return fmt.Errorf("deleting manifest %s from %s: %w", name, s.where, err)
	}
	return nil
}

// Manifests lists the names of the manifests under prefix ("" for all).
func (s *Store) Manifests(ctx context.Context, prefix string) ([]string, error) {
	it := s.b.List(&blob.ListOptions{Prefix: manifestsPrefix + prefix})
	var out []string
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing manifests in %s: %w", s.where, err)
		}
		if name, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, manifestsPrefix), ".json"); ok {
			out = append(out, name)
		}
	}
}

// Sweep deletes the blobs no manifest names that are older than grace
// (younger ones may belong to an upload whose manifest is still to come),
// and aborts the unfinished multipart uploads of blobs begun before grace
// (abortUploads); it returns how many of both it removed.
func (s *Store) Sweep(ctx context.Context, grace time.Duration) (int, error) {
	aborted, err := s.abortUploads(ctx, grace)
	if err != nil {
		return 0, err
	}
	deleted, err := s.sweepBlobs(ctx, grace)
	return aborted + deleted, err
}

// sweepBlobs is Sweep of the blobs.
func (s *Store) sweepBlobs(ctx context.Context, grace time.Duration) (int, error) {
	names, err := s.Manifests(ctx, "")
	if err != nil {
		return 0, err
	}
	named := map[string]bool{}
	for _, name := range names {
		m, err := s.GetManifest(ctx, name)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the list
		}
		if err != nil {
			// A manifest that cannot be read could name any blob: sweep
			// nothing rather than lose one.
			return 0, fmt.Errorf("sweeping %s: %w", s.where, err)
		}
		for _, b := range m.Files {
			key, _ := b.key()
			named[key] = true
		}
	}
	cutoff := time.Now().Add(-grace)
	it := s.b.List(&blob.ListOptions{Prefix: blobsPrefix})
	deleted := 0
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return deleted, nil
		}
		if err != nil {
			return deleted, fmt.Errorf("sweeping %s: %w", s.where, err)
		}
		if named[obj.Key] || obj.ModTime.After(cutoff) {
			continue
		}
		if err := s.b.Delete(ctx, obj.Key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return deleted, fmt.Errorf("sweeping %s: %w", s.where, err)
		}
		deleted++
	}
}

// localPath reports whether p, a manifest's file path, stays inside the
// directory it is fetched into: relative, clean, no "..".
func localPath(p string) bool {
	return p != "" && filepath.IsLocal(filepath.FromSlash(p)) && path.Clean(p) == p
}
