package disk

import "context"

// Quota modes for NewBtrfsWithQuotas.
const (
	QuotaSimple  = quotaSimple
	QuotaClassic = quotaClassic
	QuotaNone    = ""
)

// NewBtrfsWithQuotas is NewBtrfs turning on quotas of mode on a new image,
// so tests and benchmarks can compare simple quotas with classic ones and
// with none.
func NewBtrfsWithQuotas(ctx context.Context, dir string, sizeBytes int64, mode string) (*Btrfs, error) {
	return newBtrfs(ctx, dir, sizeBytes, mode)
}

// BlocksUsed is what du counts under root: its files' allocated blocks.
func BlocksUsed(ctx context.Context, root string) (int64, error) {
	return blocksUsed(ctx, root)
}
