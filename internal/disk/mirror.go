package disk

import (
	"bufio"
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultDebianMirror is the Debian archive the base template is fetched
// from when neither the daemon's --debian-mirror nor the host's apt
// configuration names one.
const DefaultDebianMirror = "http://deb.debian.org/debian"

// debianSuites are the suite names (codenames and aliases) of Debian's own
// archive. An apt source whose suite is one of them is a Debian mirror; an
// Ubuntu host's (jammy, noble) is not, and debootstrap of bookworm would
// fail against it.
var debianSuites = []string{
	"buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid",
	"oldoldstable", "oldstable", "stable", "testing", "unstable",
}

// ChooseDebianMirror is the mirror the base template is built from: given
// (a daemon's --debian-mirror or LOAM_DEBIAN_MIRROR) when not empty, else
// the host's apt mirror read from aptDir (see HostDebianMirror), else
// DefaultDebianMirror.
func ChooseDebianMirror(given, aptDir string) string {
	if given != "" {
		return strings.TrimRight(given, "/")
	}
	if m, ok := HostDebianMirror(aptDir); ok {
		return m
	}
	return DefaultDebianMirror
}

// HostDebianMirror returns the Debian mirror the host's apt is configured
// with, read from aptDir (/etc/apt): sources.list, then sources.list.d/*.list
// (one-line format) and *.sources (deb822), in name order. The first "deb"
// source of a Debian suite (no -updates, -security or -backports, which are
// other archives or parts of one) with the main component is the mirror;
// cdrom and apt's transport helpers (mirror+, tor+) are skipped, since
// debootstrap cannot use them. ok is false when there is none.
func HostDebianMirror(aptDir string) (mirror string, ok bool) {
	files := []string{filepath.Join(aptDir, "sources.list")}
	entries, _ := os.ReadDir(filepath.Join(aptDir, "sources.list.d"))
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".list") || strings.HasSuffix(n, ".sources") {
			files = append(files, filepath.Join(aptDir, "sources.list.d", n))
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var srcs []aptSource
		if strings.HasSuffix(f, ".sources") {
			srcs = deb822Sources(data)
		} else {
			srcs = oneLineSources(data)
		}
		for _, s := range srcs {
			if s.debianMain() {
				return strings.TrimRight(s.uri, "/"), true
			}
		}
	}
	return "", false
}

// aptSource is one apt source: a type, an archive's URI, suites and
// components.
type aptSource struct {
	types, suites, components []string
	uri                       string
	enabled                   bool
}

// debianMain reports whether s is the main archive of a Debian release
// that debootstrap can fetch from.
func (s aptSource) debianMain() bool {
	if !s.enabled || !slices.Contains(s.types, "deb") || !slices.Contains(s.components, "main") {
		return false
	}
	u, err := url.Parse(s.uri)
	if err != nil || !slices.Contains([]string{"http", "https", "ftp", "file"}, u.Scheme) {
		return false
	}
	for _, suite := range s.suites {
		if slices.Contains(debianSuites, suite) {
			return true
		}
	}
	return false
}

// oneLineSources parses sources.list's one-line format:
// "deb [opt=value …] URI SUITE COMPONENT…", with # comments.
func oneLineSources(data []byte) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		// Options in brackets may hold spaces ("[ arch=amd64 ]").
		if i := strings.Index(line, "["); i >= 0 {
			if j := strings.Index(line[i:], "]"); j >= 0 {
				line = line[:i] + " " + line[i+j+1:]
			}
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		out = append(out, aptSource{types: f[:1], uri: f[1], suites: f[2:3], components: f[3:], enabled: true})
	}
	return out
}

// deb822Sources parses the deb822 format of *.sources: stanzas of
// "Field: value" lines parted by blank lines, with continuation lines
// starting with a space and # comments.
func deb822Sources(data []byte) []aptSource {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		if len(fields) == 0 {
			return
		}
		s := aptSource{
			types:      strings.Fields(fields["types"]),
			suites:     strings.Fields(fields["suites"]),
			components: strings.Fields(fields["components"]),
			enabled:    !strings.EqualFold(strings.TrimSpace(fields["enabled"]), "no"),
		}
		// URIs may list several mirrors; the first is the one apt prefers.
		if uris := strings.Fields(fields["uris"]); len(uris) > 0 {
			s.uri = uris[0]
			out = append(out, s)
		}
		fields, last = map[string]string{}, ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}
