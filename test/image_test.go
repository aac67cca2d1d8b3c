package test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/test/harness"
)

// TestImageSandbox: a sandbox from a private registry's image (logged in
// with loam's own credentials, pulled by the create itself) follows the
// image's env, user, working dir and entrypoint; exec works in it although
// it has no libc; a fork of it keeps its image; the image cannot be
// deleted while they use it; an image naming a user it lacks is invalid.
func TestImageSandbox(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	reg := imagetest.Registry(t, "alice", "s3cret")
	ref := reg + "/bb:v1"
	// Three layers: busybox, a file in app's home, then a whiteout of an
	// applet and an opaque home with a new file.
	imagetest.Push(t, ref, imagetest.Image(t, imagetest.BusyboxConfig, imagetest.Busybox(t),
		imagetest.Layer(t, imagetest.Entry{Name: "home/app/old", Body: []byte("old"), UID: 1500, GID: 1500}),
		imagetest.Layer(t,
			imagetest.Entry{Name: "bin/.wh.vi"},
			imagetest.Entry{Name: "home/app/.wh..wh..opq"},
			imagetest.Entry{Name: "home/app/note", Body: []byte("new"), UID: 1500, GID: 1500},
		)), "alice", "s3cret")

	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "anon", Image: ref}); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("create from a private image before login: %v, want invalid", err)
	}
	if _, err := d.C.LoginRegistry(ctx, reg, "alice", "s3cret"); err != nil {
		t.Fatal(err)
	}
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "img", Image: ref, Env: map[string]string{"OWN": "mine"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Image != ref || sb.Template != "" || sb.Env["GREETING"] != "from-image" || sb.Env["OWN"] != "mine" {
		t.Errorf("created %+v; want image %s, its env under the create's", sb, ref)
	}
	checkImageSandbox(t, d, "img", "mine")

	// A memory checkpoint and a fork of it: the fork is of the image too.
	cp, err := d.C.CreateCheckpoint(ctx, "img", api.CreateCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}
	// Its env is its own, over the image's.
	fork, err := d.C.ForkWith(ctx, "img", cp.ID, api.CreateSandbox{Name: "img-fork", Env: map[string]string{"OWN": "forked"}})
	if err != nil {
		t.Fatal(err)
	}
	if fork.Image != ref {
		t.Errorf("fork's image %q, want %q", fork.Image, ref)
	}
	checkImageSandbox(t, d, "img-fork", "forked")

	id := image.ID(ref)
	im, err := d.C.GetImage(ctx, id)
	if err != nil || im.State != api.ImageReady || im.Pulled != im.Size || im.Size == 0 {
		t.Errorf("image %+v, %v; want ready, pulled = size > 0", im, err)
	}
	if err := d.C.DeleteImage(ctx, id); !errors.Is(err, api.ErrConflict) {
		t.Errorf("deleting the image while sandboxes use it: %v, want conflict", err)
	}
	if err := d.C.DeleteSandbox(ctx, "img"); err != nil {
		t.Fatal(err)
	}
	if err := d.C.DeleteImage(ctx, id); !errors.Is(err, api.ErrConflict) {
		t.Errorf("deleting the image while the fork uses it: %v, want conflict", err)
	}
	if err := d.C.DeleteSandbox(ctx, "img-fork"); err != nil {
		t.Fatal(err)
	}
	if err := d.C.DeleteImage(ctx, id); err != nil {
		t.Errorf("deleting the image once unused: %v", err)
	}

	ghost := imagetest.BusyboxConfig
	ghost.User = "ghost"
	imagetest.Push(t, reg+"/ghost:v1", imagetest.Image(t, ghost, imagetest.Busybox(t)), "alice", "s3cret")
	_, err = d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "ghost", Image: reg + "/ghost:v1"})
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), `"ghost"`) {
		t.Errorf("an image whose user is missing: %v, want invalid naming it", err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Image: ref, Template: "busybox"}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("template and image: %v, want invalid", err)
	}

	// loam template build from an image (pulled again, since it was
	// deleted): the template keeps what --run made, and is listed beside
	// the image, which is listed as a template too.
	if out, errOut, code := d.CLI("", "template", "build", "imgtpl", "--image", ref, "--run", "echo built > /home/app/built"); code != 0 {
		t.Fatalf("template build --image: %d %q %q", code, out, errOut)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "from-imgtpl", Template: "imgtpl"}); err != nil {
		t.Fatal(err)
	}
	if got := d.Run("from-imgtpl", "cat", "/home/app/built"); got != "built\n" {
		t.Errorf("a sandbox of the built template: /home/app/built = %q", got)
	}
	tpls, err := d.C.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, tpl := range tpls {
		kinds[tpl.Name] = tpl.Kind + "/" + tpl.State
	}
	if kinds["imgtpl"] != api.TemplateCheckpoint+"/"+api.TemplateReady || kinds[ref] != api.TemplateImage+"/"+api.TemplateReady {
		t.Errorf("templates: %v", kinds)
	}
}

// checkImageSandbox checks that a sandbox of imagetest.BusyboxConfig runs as its
// image says, with own as the variable OWN its create gave.
func checkImageSandbox(t *testing.T, d *harness.Daemon, name, own string) {
	t.Helper()
	if got := d.Run(name, "sh", "-c", `echo "$(id -un) $(pwd) $GREETING $OWN"`); got != "app /srv from-image "+own+"\n" {
		t.Errorf("%s: exec saw %q, want the image's user, dir and env, and the create's", name, got)
	}
	if got := d.Run(name, "id", "-un"); got != "app\n" {
		t.Errorf("%s: id -un = %q", name, got)
	}
	waitService(t, d, name, "entrypoint", "running", running)
	var started []byte
	harness.Eventually(t, 30*time.Second, name+": the entrypoint writes /srv/started", func() error {
		out, _, code, err := d.C.Output(harness.Ctx(t), name, "cat", "/srv/started")
		if err == nil && code != 0 {
			err = fmt.Errorf("cat exited %d", code)
		}
		started = out
		return err
	})
	if string(started) != "from-image as app in /srv\n" {
		t.Errorf("%s: the entrypoint wrote %q", name, started)
	}
	// The layers' whiteouts and opaque directory, seen from inside.
	if got := d.Run(name, "sh", "-c", `ls -A /home/app; test -e /bin/vi || echo no-vi; stat -c %U /home/app/note`); got != "note\nno-vi\napp\n" {
		t.Errorf("%s: the layers give %q, want home/app with note alone (app's), and no vi", name, got)
	}
	// Not Debian, no libc: the agent is what runs.
	if out, _, code, _ := d.C.Output(harness.Ctx(t), name, "ls", "/lib", "/usr"); code == 0 {
		t.Errorf("%s: /lib or /usr exists (%q); the image should have neither", name, out)
	}
}

// TestImageCLI: loam image login, pull (quiet without a terminal: the id
// alone), ls, rm and logout against a real daemon and registry.
func TestImageCLI(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	reg := imagetest.Registry(t, "bob", "pw")
	ref := reg + "/cli:v1"
	imagetest.Push(t, ref, imagetest.Image(t, imagetest.BusyboxConfig, imagetest.Busybox(t)), "bob", "pw")

	if _, stderr, code := d.CLI("", "image", "pull", ref); code == 0 || !strings.Contains(stderr, "401") {
		t.Errorf("pull before login: code %d, stderr %q; want a failure saying 401", code, stderr)
	}
	if _, stderr, code := d.CLI("pw\n", "image", "login", reg, "-u", "bob", "--password-stdin"); code != 0 {
		t.Fatalf("login: %d %s", code, stderr)
	}
	out, stderr, code := d.CLI("", "image", "pull", ref)
	if code != 0 || out != image.ID(ref)+"\n" || stderr != "" {
		t.Fatalf("pull: code %d, stdout %q, stderr %q; want the id alone", code, out, stderr)
	}
	out, _, _ = d.CLI("", "image", "ls")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[1], ref) || !strings.Contains(lines[1], "ready") {
		t.Errorf("ls:\n%s", out)
	}
	if _, stderr, code := d.CLI("", "image", "rm", image.ID(ref)); code == 0 || !strings.Contains(stderr, "-y") {
		t.Errorf("rm without a terminal or -y: %d %q", code, stderr)
	}
	if _, stderr, code := d.CLI("", "image", "rm", "-y", image.ID(ref)); code != 0 {
		t.Errorf("rm -y: %d %q", code, stderr)
	}
	if _, stderr, code := d.CLI("", "image", "logout", reg); code != 0 {
		t.Errorf("logout: %d %q", code, stderr)
	}
}

// BenchmarkCreateFromImage: time from the create call to a running
// sandbox (its agent answering, its entrypoint service started) for an
// image pulled already.
func BenchmarkCreateFromImage(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := b.Context()
	reg := imagetest.Registry(b, "", "")
	ref := reg + "/bench:v1"
	imagetest.Push(b, ref, imagetest.Image(b, imagetest.BusyboxConfig, imagetest.Busybox(b)), "", "")
	im, err := d.C.PullImage(ctx, ref)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := d.C.WaitImage(ctx, im.ID, 0, nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		name := "bench-img-" + strconv.Itoa(i)
		sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Image: ref})
		if err != nil || sb.State != api.StateRunning {
			b.Fatal(sb, err)
		}
		b.StopTimer()
		if err := d.C.DeleteSandbox(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
