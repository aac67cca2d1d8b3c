package test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sort"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_filesTree moves whole trees in and out of a sandbox from Go,
// against a real daemon: a tar uploaded into a new directory, listed two
// levels deep, a file renamed and a symlink looked at, the tree downloaded
// as a tar, and removed.
func Example_filesTree() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "tree"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "tree")

	dir, err := c.Mkdir(ctx, "tree", "/home/loam/project", &client.FileOptions{Mode: 0o750})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dir.Path, dir.Type, dir.Mode)

	// A tar made here, extracted there.
	var up bytes.Buffer
	tw := tar.NewWriter(&up)
	for _, f := range []struct {
		name, body, link string
		mode             int64
	}{
		{name: "README", body: "a project\n", mode: 0o644},
		{name: "src/", mode: 0o755},
		{name: "src/main.sh", body: "echo hello from the archive\n", mode: 0o755},
		{name: "run", link: "src/main.sh", mode: 0o777},
	} {
		h := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg}
		switch {
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		case f.name[len(f.name)-1] == '/':
			h.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			log.Fatal(err)
		}
		if _, err := io.WriteString(tw, f.body); err != nil {
			log.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		log.Fatal(err)
	}
	if err := c.WriteArchive(ctx, "tree", "/home/loam/project", &up, nil); err != nil {
		log.Fatal(err)
	}
	if _, err := c.MoveFile(ctx, "tree", "/home/loam/project/README", "/home/loam/project/README.md", nil); err != nil {
		log.Fatal(err)
	}
	list, err := c.ListFiles(ctx, "tree", "/home/loam/project", &client.FileOptions{Depth: 2})
	if err != nil {
		log.Fatal(err)
	}
	var show func(entries []api.FileInfo)
	show = func(entries []api.FileInfo) {
		for _, e := range entries {
			if e.Type == api.FileTypeFile {
				fmt.Println(e.Path, e.Type, e.Mode, e.Size, "bytes")
			} else {
				fmt.Println(e.Path, e.Type, e.Mode)
			}
			show(e.Entries)
		}
	}
	show(list.Entries)
	link, err := c.StatFile(ctx, "tree", "/home/loam/project/run", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(link.Path, link.Type, "->", link.Target)
	out, _, _, err := c.Output(ctx, "tree", "sh", "/home/loam/project/run")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))

	// And back out, as a tar.
	down, err := c.ReadArchive(ctx, "tree", "/home/loam/project", nil)
	if err != nil {
		log.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(down)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		names = append(names, h.Name)
	}
	down.Close()
	sort.Strings(names)
	fmt.Println("downloaded:", names)

	err = c.RemoveFile(ctx, "tree", "/home/loam/project", nil)
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		fmt.Println("not empty:", apiErr.Code)
	}
	if err := c.RemoveFile(ctx, "tree", "/home/loam/project", &client.FileOptions{Recursive: true}); err != nil {
		log.Fatal(err)
	}
	_, err = c.StatFile(ctx, "tree", "/home/loam/project", nil)
	fmt.Println("removed:", errors.Is(err, api.ErrNotFound))
	// Output:
	// /home/loam/project dir 0750
	// /home/loam/project/README.md file 0644 10 bytes
	// /home/loam/project/run symlink 0777
	// /home/loam/project/src dir 0755
	// /home/loam/project/src/main.sh file 0755 28 bytes
	// /home/loam/project/run symlink -> src/main.sh
	// hello from the archive
	// downloaded: [README.md run src/ src/main.sh]
	// not empty: conflict
	// removed: true
}
