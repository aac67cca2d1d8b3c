package disk_test

import (
	"testing"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/disk/disktest"
)

func TestCopy(t *testing.T) {
	disktest.Run(t, func(t *testing.T) disk.Pool { return newCopy(t) })
}
