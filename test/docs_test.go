package test

// The manual's pages are tested: every shell session a page shows is run,
// command by command, against a real daemon, and what the commands print is
// compared with what the page says they print.
//
// What is run:
//   - docs/tutorial.md: every fenced block that holds a line starting with
//     "$ ", in order, against one daemon.
//   - every other page under docs/ (docs/reference excepted, which is
//     generated): its ```console blocks, in order, against a daemon of the
//     page's own. ```sh blocks there are illustrations with placeholders and
//     are not run.
//
// How a block is read: a line starting with "$ " is a command; it goes on
// over the next lines while it ends with a backslash or has a quote left
// open, as in a shell. The lines after it, up to the next command or the end
// of the block, are its output: stdout and stderr as a terminal shows them.
//
// How a command is run: with bash -c, in a scratch directory, with the
// test's loam first on PATH and LOAM_API_URL and LOAM_TOKEN naming the
// test's daemon, on a pseudo-terminal (stdin, stdout and stderr), as a
// person at a terminal runs it. When it asks to confirm ("… [y/N] "), the
// answer the page shows after that prompt is typed.
//
// How output is compared: both the page's output and the command's are
// normalized, then must be equal line for line, except that a line "..." on
// the page stands for any number of lines (zero included). Normalizing:
//   - the terminal: its "\r\n" is "\n", and colour escapes (jq colours
//     its output on a terminal) are dropped, as a terminal shows colours,
//     not codes; a line's carriage returns write what follows over it, as
//     a terminal does (a progress bar drawn and cleared leaves spaces);
//     trailing spaces are dropped;
//   - times: 2026-10-12 05:17:36 and 2026-10-12T09:17:36.094927Z (any
//     fraction, Z or an offset) are <time>;
//   - ids made at random: sandbox ids sb-xxxxxxxxxxxx, session ids
//     s-xxxxxxxxxxxx, generated checkpoint names checkpoint-xxxxxx, access
//     tokens loam_at_… and API tokens loam_… are their prefix and <id>;
//   - PIDs: the number that starts a line of `pgrep -a` ("314 python3 …")
//     and the cells of a column headed PID are <pid>;
//   - column padding: a run of two or more spaces is one gap of two, since
//     a table's widths follow its ids and PIDs.
// Durations and sizes that a command measures would be normalized too, but
// no page shows one: sizes and durations shown are the ones given or
// configured (512Mi, 10m), and compare as they are. Everything else,
// checkpoint ids (v1, auto-1), names, states, messages, exit codes printed,
// compares exactly.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"loam.dev/loam/test/harness"
)

// docsDir is the manual, from this package's directory.
const docsDir = "../docs"

// TestTutorial runs every shell block of docs/tutorial.md against a real
// daemon and compares the output with the page.
func TestTutorial(t *testing.T) {
	t.Parallel()
	page := filepath.Join(docsDir, "tutorial.md")
	blocks, err := readPage(page, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) == 0 {
		t.Fatalf("%s has no shell blocks", page)
	}
	d := harness.StartDaemon(t, "--default-template", "base")
	runBlocks(t, d, page, blocks)
}

// TestDocsPages runs the ```console blocks of every other page of the manual,
// and of the README.
func TestDocsPages(t *testing.T) {
	t.Parallel()
	var pages []string
	err := filepath.WalkDir(docsDir, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && e.Name() == "reference" {
			return filepath.SkipDir
		}
		if !e.IsDir() && strings.HasSuffix(path, ".md") && e.Name() != "tutorial.md" {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(docsDir, "..", "README.md"))
	tested := 0
	for _, page := range pages {
		blocks, err := readPage(page, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(blocks) == 0 {
			continue
		}
		tested++
		rel, _ := filepath.Rel(docsDir, page)
		rel = strings.TrimPrefix(rel, "../") // the README
		t.Run(rel, func(t *testing.T) {
			d := harness.StartDaemon(t, "--default-template", "base")
			runBlocks(t, d, page, blocks)
		})
	}
	if tested == 0 {
		t.Fatalf("no page under %s has a console block", docsDir)
	}
}

// docStep is one command of a page and the output the page shows for it.
type docStep struct {
	line int    // of the command, in the page
	cmd  string // as given to bash -c
	want []string
}

// readPage reads a page's shell sessions: with all, every fenced block that
// holds a "$ " line (the tutorial); else only ```console blocks.
func readPage(path string, all bool) ([][]docStep, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	var blocks [][]docStep
	for i := 0; i < len(lines); i++ {
		fence, info, ok := fenceOpen(lines[i])
		if !ok {
			continue
		}
		start := i + 1
		end := start
		for end < len(lines) && strings.TrimSpace(lines[end]) != fence {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("%s:%d: code block never closed", path, i+1)
		}
		i = end
		if !all && info != "console" {
			continue
		}
		steps, err := parseSession(lines[start:end], start+1)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(steps) > 0 {
			blocks = append(blocks, steps)
		} else if info == "console" {
			return nil, fmt.Errorf("%s:%d: console block without a command", path, start)
		}
	}
	return blocks, nil
}

// fenceOpen reports whether line opens a fenced code block, with the fence
// that closes it and the block's info string.
func fenceOpen(line string) (fence, info string, ok bool) {
	for _, f := range []string{"```", "~~~"} {
		if strings.HasPrefix(line, f) {
			n := len(line) - len(strings.TrimLeft(line, f[:1]))
			return line[:n], strings.TrimSpace(line[n:]), true
		}
	}
	return "", "", false
}

// parseSession splits a block's lines into commands and their outputs.
// first is the page's line number of lines[0].
func parseSession(lines []string, first int) ([]docStep, error) {
	var steps []docStep
	for i := 0; i < len(lines); i++ {
		cmd, ok := strings.CutPrefix(lines[i], "$ ")
		if !ok {
			if len(steps) == 0 {
				if strings.TrimSpace(lines[i]) == "" {
					continue
				}
				// A block that does not start with a command is not a session.
				return nil, nil
			}
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, lines[i])
			continue
		}
		at := first + i
		for !shellComplete(cmd) {
			i++
			if i == len(lines) {
				return nil, fmt.Errorf("line %d: command never ends", at)
			}
			cmd += "\n" + lines[i]
		}
		steps = append(steps, docStep{line: at, cmd: cmd})
	}
	return steps, nil
}

// shellComplete reports whether cmd is a whole shell command: no quote left
// open and no trailing backslash.
func shellComplete(cmd string) bool {
	var single, double, escaped bool
	for _, c := range cmd {
		switch {
		case escaped:
			escaped = false
		case single:
			single = c != '\''
		case c == '\\':
			escaped = true
		case double:
			double = c != '"'
		case c == '\'':
			single = true
		case c == '"':
			double = true
		}
	}
	return !single && !double && !escaped
}

// runBlocks runs a page's blocks in order, one command at a time, and fails
// the test at the first command whose output is not the page's.
func runBlocks(t *testing.T, d *harness.Daemon, page string, blocks [][]docStep) {
	t.Helper()
	work := t.TempDir()
	path := filepath.Dir(harness.LoamBin) + string(os.PathListSeparator) + os.Getenv("PATH")
	env := append(os.Environ(), "PATH="+path, "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token, "TERM=dumb")
	for _, steps := range blocks {
		for _, s := range steps {
			got, err := runOnTerminal(s.cmd, work, env, answers(s.want))
			if err != nil {
				t.Fatalf("%s:%d: $ %s: %v\noutput so far:\n%s", page, s.line, s.cmd, err, got)
			}
			if diff := compareOutput(s.want, splitOutput(got)); diff != "" {
				t.Fatalf("%s:%d: $ %s\nthe output is not the page's (after normalizing; - page, + product):\n%s", page, s.line, s.cmd, diff)
			}
		}
	}
}

// promptRE is a confirmation prompt as the page shows it, with the answer
// typed after it.
var promptRE = regexp.MustCompile(`\? \[y/N\] (.*)$`)

// answers are what the page shows typed at each confirmation prompt.
func answers(want []string) []string {
	var a []string
	for _, l := range want {
		if m := promptRE.FindStringSubmatch(l); m != nil {
			a = append(a, m[1])
		}
	}
	return a
}

// runOnTerminal runs cmd with bash on a new pseudo-terminal and returns all
// it wrote there. At each "[y/N] " prompt it types the next of answers
// (Enter alone, a no, once they run out).
func runOnTerminal(cmd, dir string, env, answers []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Dir, c.Env = dir, env
	tty, err := pty.StartWithSize(c, &pty.Winsize{Rows: 50, Cols: 200})
	if err != nil {
		return "", err
	}
	defer tty.Close()
	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		seen := 0 // output already looked at for a prompt
		for {
			n, err := tty.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			if i := bytes.Index(out.Bytes()[seen:], []byte("[y/N] ")); i >= 0 {
				seen += i + len("[y/N] ")
				answer := ""
				if len(answers) > 0 {
					answer, answers = answers[0], answers[1:]
				}
				_, _ = io.WriteString(tty, answer+"\n")
			}
			mu.Unlock()
			if err != nil {
				return // EIO once the command and all it started have closed the terminal
			}
		}
	}()
	werr := c.Wait()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	mu.Lock()
	defer mu.Unlock()
	if ctx.Err() != nil {
		return out.String(), fmt.Errorf("still running after 3 minutes")
	}
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		return out.String(), werr
	}
	// A command's exit status is not compared: what it printed, error
	// messages included, is.
	return out.String(), nil
}

// splitOutput is a terminal's output as lines, without the last newline.
func splitOutput(s string) []string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = colourRE.ReplaceAllString(s, "")
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = overwrite(l)
	}
	return lines
}

// overwrite is what a terminal shows of a line with carriage returns in
// it: each one takes the cursor back to the start of the line, and what
// follows is written over what was there. A progress bar, drawn, redrawn
// and cleared that way, leaves spaces, which the comparison drops.
func overwrite(line string) string {
	if !strings.Contains(line, "\r") {
		return line
	}
	var screen []rune
	col := 0
	for _, r := range line {
		if r == '\r' {
			col = 0
			continue
		}
		if col < len(screen) {
			screen[col] = r
		} else {
			screen = append(screen, r)
		}
		col++
	}
	return string(screen)
}

// The normalizing rules described at the top of this file.
var (
	timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?`)
	idREs  = []*regexp.Regexp{
		regexp.MustCompile(`\b(sb-)[0-9a-z]{12}\b`),
		regexp.MustCompile(`\b(s-)[0-9a-z]{12}\b`),
		regexp.MustCompile(`\b(checkpoint-)[0-9a-f]{6}\b`),
		regexp.MustCompile(`\b(loam_at_)[A-Za-z0-9_-]+`),
		regexp.MustCompile(`\b(loam_)[A-Z0-9]{20,}`),
	}
	colourRE = regexp.MustCompile("\x1b\\[[0-9;]*m")
	pgrepRE  = regexp.MustCompile(`^\d+ (\S)`)
	gapRE    = regexp.MustCompile(` {2,}`)
	headerRE = regexp.MustCompile(`^[A-Z_]+$`)
)

// normalize applies the rules to lines (the page's or a command's).
func normalize(lines []string) []string {
	out := make([]string, len(lines))
	pidCol := -1 // the PID column of the table being read, if any
	for i, l := range lines {
		l = strings.TrimRight(l, " \r")
		l = timeRE.ReplaceAllString(l, "<time>")
		for _, re := range idREs {
			l = re.ReplaceAllString(l, "${1}<id>")
		}
		cells := gapRE.Split(l, -1)
		switch {
		case len(cells) > 1 && allHeaders(cells):
			pidCol = -1
			for j, c := range cells {
				if c == "PID" {
					pidCol = j
				}
			}
		case l == "":
			pidCol = -1
		case pidCol >= 0 && pidCol < len(cells) && isDigits(cells[pidCol]):
			cells[pidCol] = "<pid>"
		}
		l = strings.Join(cells, "  ")
		if len(cells) == 1 {
			l = pgrepRE.ReplaceAllString(l, "<pid> $1")
		}
		out[i] = l
	}
	return out
}

func allHeaders(cells []string) bool {
	for _, c := range cells {
		if !headerRE.MatchString(c) {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// compareOutput says how got differs from want, both normalized, with "..."
// in want matching any lines; "" when they agree.
func compareOutput(want, got []string) string {
	w, g := normalize(want), normalize(got)
	if matchLines(w, g) {
		return ""
	}
	var b strings.Builder
	for _, l := range w {
		fmt.Fprintf(&b, "- %s\n", l)
	}
	for _, l := range g {
		fmt.Fprintf(&b, "+ %s\n", l)
	}
	return b.String()
}

// matchLines matches got against want, where a want line "..." is any
// number of lines.
func matchLines(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "..." {
		for k := 0; k <= len(got); k++ {
			if matchLines(want[1:], got[k:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && want[0] == got[0] && matchLines(want[1:], got[1:])
}

// TestDocsNormalize holds the comparison to its rules: what differs from
// run to run compares equal, and nothing else does.
func TestDocsNormalize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		want, got []string
		equal     bool
	}{
		{"times and ids", []string{"scratch  sb-2kjiso7vff5b  running  base      2026-10-12 05:17:30"},
			[]string{"scratch  sb-19vy1og2z8u4  running  base      2026-12-02 17:27:44"}, true},
		{"a checkpoint id is not a random id", []string{"v1"}, []string{"v2"}, false},
		{"a state", []string{"scratch\trunning"}, []string{"scratch\tsleeping"}, false},
		{"a tab is not spaces", []string{"scratch\trunning"}, []string{"scratch  running"}, false},
		{"pgrep's PID", []string{"314 python3 -m http.server"}, []string{"12 python3 -m http.server"}, true},
		{"pgrep's command", []string{"314 python3 -m http.server"}, []string{"12 python3 -m http.server 9090"}, false},
		{"a number that is not a PID", []string{"8080  0.0.0.0    no"}, []string{"9090  0.0.0.0    no"}, false},
		{"a PID column", []string{"NAME  STATE    PID  CMD", "web   running  41   python3"},
			[]string{"NAME  STATE    PID   CMD", "web   running  4107  python3"}, true},
		{"a RESTARTS column", []string{"NAME  PID  RESTARTS", "web   41   0"},
			[]string{"NAME  PID  RESTARTS", "web   41   3"}, false},
		{"JSON times", []string{`"created_at":"2026-10-12T09:17:36.094927Z"`},
			[]string{`"created_at":"2026-12-02T17:27:44.969188367Z"`}, true},
		{"... is any lines", []string{"name: a", "...", "created: x"}, []string{"name: a", "id: 1", "url: u", "created: x"}, true},
		{"... is no lines", []string{"name: a", "...", "created: x"}, []string{"name: a", "created: x"}, true},
		{"a line missing", []string{"v1", "v2"}, []string{"v1"}, false},
		{"a line too many", []string{"v1"}, []string{"v1", "v2"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			diff := compareOutput(tc.want, tc.got)
			if (diff == "") != tc.equal {
				t.Errorf("compareOutput(%q, %q) = %q; want equal: %v", tc.want, tc.got, diff, tc.equal)
			}
		})
	}
}

// TestDocsOverwrite: a progress bar cleared on the terminal leaves nothing
// of itself in what a command printed.
func TestDocsOverwrite(t *testing.T) {
	t.Parallel()
	got := splitOutput("\rcreating scratch  |/| [1s]\r                              \r\rname:        scratch\r\nid: x\r\n")
	want := []string{"name:        scratch", "id: x"}
	if diff := compareOutput(want, got); diff != "" {
		t.Errorf("splitOutput = %q; want %q: %s", got, want, diff)
	}
	if got := overwrite("abc\rX"); got != "Xbc" {
		t.Errorf("overwrite(abc CR X) = %q, want Xbc", got)
	}
}

// TestDocsSessionParse checks how a block is cut into commands and outputs.
func TestDocsSessionParse(t *testing.T) {
	t.Parallel()
	block := []string{
		`$ loam run scratch -- sh -c 'a &&`,
		`    b' </dev/null`,
		`$ curl -sS \`,
		`    "$LOAM_API_URL/v1/sandboxes"`,
		`{"sandboxes":[]}`,
		`$ loam checkpoint rm scratch v1`,
		`Delete checkpoint v1 of scratch? [y/N] y`,
	}
	steps, err := parseSession(block, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 {
		t.Fatalf("got %d commands, want 3: %+v", len(steps), steps)
	}
	if want := "loam run scratch -- sh -c 'a &&\n    b' </dev/null"; steps[0].cmd != want || len(steps[0].want) != 0 {
		t.Errorf("first command %q with output %q", steps[0].cmd, steps[0].want)
	}
	if steps[1].line != 3 || len(steps[1].want) != 1 {
		t.Errorf("second command at line %d with output %q", steps[1].line, steps[1].want)
	}
	if a := answers(steps[2].want); len(a) != 1 || a[0] != "y" {
		t.Errorf("answers = %q, want [y]", a)
	}
}
