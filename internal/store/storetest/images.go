package storetest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Images is what a store that keeps images has (store/sqlite does): each
// org's, ListImages of "" listing every org's.
type Images interface {
	PutImage(ctx context.Context, im *store.Image) error
	GetImage(ctx context.Context, org, id string) (*store.Image, error)
	ListImages(ctx context.Context, org string) ([]*store.Image, error)
	DeleteImage(ctx context.Context, org, id string) error
}

// RunImages runs the suite of image records; newStore must return a new,
// empty store, which RunImages closes.
func RunImages(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, st Images)
	}{
		{"RoundTrip", testImageRoundTrip},
		{"Update", testImageUpdate},
		{"RefConflict", testImageRefConflict},
		{"DeleteNotFound", testImageDelete},
		{"Orgs", testImageOrgs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := openAs[Images](t, newStore, "images")
			tc.fn(t.Context(), t, st)
		})
	}
}

func newImage(n int) *store.Image {
	return &store.Image{
		Image: api.Image{
			ID: "im-" + string(rune('a'+n)), Ref: "localhost:5000/app:" + string(rune('a'+n)),
			Digest: "sha256:0123", State: api.ImageReady, Error: "", Size: 1 << 40,
			Config: api.ImageConfig{Env: []string{"A=1", "PATH=/bin"}, WorkingDir: "/srv", User: "app:app",
				Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"echo hi"}},
			CreatedAt: t0.Add(time.Duration(n) * time.Second),
		},
		Template:    "img-0123",
		UserMissing: true,
		Org:         "docs",
	}
}

func testImageRoundTrip(ctx context.Context, t *testing.T, st Images) {
	a, b := newImage(1), newImage(0)
	for _, im := range []*store.Image{a, b} {
		if err := st.PutImage(ctx, im); err != nil {
			t.Fatalf("PutImage: %v", err)
		}
	}
	got, err := st.GetImage(ctx, "docs", a.ID)
	if err != nil {
		t.Fatalf("GetImage: %v", err)
	}
	checkTime(t, "created_at", got.CreatedAt, a.CreatedAt)
	g, w := *got, *a
	g.CreatedAt, w.CreatedAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("GetImage:\n got %+v\nwant %+v", g, w)
	}
	list, err := st.ListImages(ctx, "docs")
	if err != nil || len(list) != 2 || list[0].ID != b.ID || list[1].ID != a.ID {
		t.Errorf("ListImages: %v, %v; want %s then %s", list, err, b.ID, a.ID)
	}
	if _, err := st.GetImage(ctx, "docs", "im-nope"); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetImage of a missing image: %v, want ErrNotFound", err)
	}
}

func testImageUpdate(ctx context.Context, t *testing.T, st Images) {
	im := newImage(1)
	im.State, im.Template, im.Digest = api.ImagePulling, "", ""
	if err := st.PutImage(ctx, im); err != nil {
		t.Fatal(err)
	}
	im.State, im.Template, im.Digest, im.Error = api.ImageError, "img-1", "sha256:99", "boom"
	if err := st.PutImage(ctx, im); err != nil {
		t.Fatalf("PutImage over an existing id: %v", err)
	}
	got, err := st.GetImage(ctx, "docs", im.ID)
	if err != nil || got.State != api.ImageError || got.Template != "img-1" || got.Digest != "sha256:99" || got.Error != "boom" {
		t.Errorf("after update: %+v, %v", got, err)
	}
}

func testImageRefConflict(ctx context.Context, t *testing.T, st Images) {
	a, b := newImage(1), newImage(2)
	b.Ref = a.Ref
	if err := st.PutImage(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := st.PutImage(ctx, b); !errorsIs(err, store.ErrExists) {
		t.Errorf("PutImage of a second record with one ref: %v, want ErrExists", err)
	}
}

func testImageDelete(ctx context.Context, t *testing.T, st Images) {
	im := newImage(1)
	if err := st.PutImage(ctx, im); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteImage(ctx, "docs", im.ID); err != nil {
		t.Fatalf("DeleteImage: %v", err)
	}
	if err := st.DeleteImage(ctx, "docs", im.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("DeleteImage again: %v, want ErrNotFound", err)
	}
	if _, err := st.GetImage(ctx, "docs", im.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetImage after delete: %v, want ErrNotFound", err)
	}
}

// testImageOrgs: the same id and ref in two orgs are two records, each
// found, listed and deleted in its own org alone.
func testImageOrgs(ctx context.Context, t *testing.T, st Images) {
	docs, ops := newImage(1), newImage(1)
	ops.Org, ops.Digest = "ops", "sha256:4567"
	for _, im := range []*store.Image{docs, ops} {
		if err := st.PutImage(ctx, im); err != nil {
			t.Fatalf("PutImage of %s's: %v", im.Org, err)
		}
	}
	for _, im := range []*store.Image{docs, ops} {
		got, err := st.GetImage(ctx, im.Org, im.ID)
		if err != nil || got.Org != im.Org || got.Digest != im.Digest {
			t.Errorf("GetImage of %s's: %+v, %v", im.Org, got, err)
		}
		if list, err := st.ListImages(ctx, im.Org); err != nil || len(list) != 1 || list[0].Org != im.Org {
			t.Errorf("ListImages of %s: %v, %v; want its own", im.Org, list, err)
		}
	}
	if _, err := st.GetImage(ctx, "other", docs.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetImage in an org without it: %v, want ErrNotFound", err)
	}
	if list, err := st.ListImages(ctx, ""); err != nil || len(list) != 2 {
		t.Errorf("ListImages of every org: %v, %v; want 2", list, err)
	}
	if err := st.DeleteImage(ctx, "ops", ops.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetImage(ctx, "docs", docs.ID); err != nil {
		t.Errorf("docs' image after ops' was deleted: %v", err)
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
