package postgres

import (
	"fmt"
	"path/filepath"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/internal/store/sqlite"
)

// BenchmarkStores measures what issue 23 asks of PostgreSQL against
// SQLite on one node: a sandbox's get, a list of 1,000 sandboxes, a
// create, and a checkpoint's record. Each store holds 1,000 sandboxes
// first. Both make every write durable before it returns (SQLite
// synchronous=FULL, PostgreSQL's commit), on this machine's disk:
//
//	go test ./internal/store/postgres -run '^$' -bench Stores -benchtime 2000x
func BenchmarkStores(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) store.Store
	}{
		{"sqlite", func(b *testing.B) store.Store {
			s, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "loam.db"))
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"postgres", func(b *testing.B) store.Store {
			s, err := Open(b.Context(), pgtest.NewDatabase(b))
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
	for _, kind := range stores {
		b.Run(kind.name, func(b *testing.B) {
			st := kind.open(b)
			defer st.Close()
			ctx := b.Context()
			record := func(n int) *store.Sandbox {
				sb := &store.Sandbox{}
				sb.ID, sb.Name, sb.Org, sb.State = fmt.Sprintf("sb-%06d", n), fmt.Sprintf("box-%d", n), "default", api.StateRunning
				sb.Labels, sb.CreatedAt, sb.NetIndex = map[string]string{"team": "a"}, store.Now(), n
				return sb
			}
			for n := range 1000 {
				if err := st.CreateSandbox(ctx, record(n)); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("get", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if _, err := st.GetSandbox(ctx, "default", fmt.Sprintf("box-%d", i%1000)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("list-1000", func(b *testing.B) {
				for b.Loop() {
					list, err := st.ListSandboxes(ctx, store.Filter{Org: "default"})
					if err != nil || len(list) < 1000 {
						b.Fatal(len(list), err)
					}
				}
			})
			next := 1000
			b.Run("create", func(b *testing.B) {
				for b.Loop() {
					if err := st.CreateSandbox(ctx, record(next)); err != nil {
						b.Fatal(err)
					}
					next++
				}
			})
			seq := 0 // across the runs of the sub-benchmark (-count)
			b.Run("checkpoint-record", func(b *testing.B) {
				for b.Loop() {
					seq++
					cp := &store.Checkpoint{}
					cp.ID, cp.Sandbox, cp.SandboxName, cp.CreatedAt = fmt.Sprintf("v%d", seq), "sb-000000", "box-0", store.Now()
					if err := st.CreateCheckpoint(ctx, cp); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
