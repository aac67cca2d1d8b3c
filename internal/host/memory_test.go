package host

import "testing"

// TestMemory: this host has memory, and some of it available.
func TestMemory(t *testing.T) {
	total, avail, err := Memory()
	if err != nil || total <= 0 || avail <= 0 || avail > total {
		t.Fatalf("Memory() = %d, %d, %v", total, avail, err)
	}
}

// TestCPUFeatures: an x86-64 or arm64 CPU lists features.
func TestCPUFeatures(t *testing.T) {
	if f := CPUFeatures(); len(f) == 0 {
		t.Fatalf("CPUFeatures() = %v", f)
	}
}
