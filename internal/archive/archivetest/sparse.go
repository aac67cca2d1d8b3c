// Package archivetest holds tars for the tests of the extractor's callers,
// and reads the zstd streams of template archives back for theirs.
package archivetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"strconv"
)

// SparseTar is a tar of one PAX sparse file (GNU format 1.0) named name,
// realSize bytes long with one byte of data: a few kilobytes that the tar
// reader reads back as realSize bytes. Go's tar.Writer writes no sparse
// file, so the extended header is written as a file and retyped.
func SparseTar(name string, realSize int64) ([]byte, error) {
	var recs string
	for _, kv := range [][2]string{{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"}, {"GNU.sparse.name", name}, {"GNU.sparse.realsize", strconv.FormatInt(realSize, 10)}} {
		rec := " " + kv[0] + "=" + kv[1] + "\n"
		// A record's length counts its own digits.
		n := len(rec) + len(strconv.Itoa(len(rec)))
		if len(strconv.Itoa(n)) > len(strconv.Itoa(len(rec))) {
			n++
		}
		recs += strconv.Itoa(n) + rec
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "PaxHeaders/" + name, Typeflag: tar.TypeReg, Size: int64(len(recs)), Format: tar.FormatUSTAR}); err != nil {
		return nil, err
	}
	if _, err := tw.Write([]byte(recs)); err != nil {
		return nil, err
	}
	if err := tw.Flush(); err != nil {
		return nil, err
	}
	hdr := buf.Bytes()[:512]
	hdr[156] = tar.TypeXHeader
	copy(hdr[148:156], "        ")
	sum := 0
	for _, c := range hdr {
		sum += int(c)
	}
	copy(hdr[148:156], fmt.Sprintf("%06o\x00 ", sum))
	// The sparse map (one region: 1 byte at offset 0), padded to a block,
	// then the data.
	data := append([]byte("1\n0\n1\n"), make([]byte, 512-6)...)
	data = append(data, 'x')
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), Format: tar.FormatUSTAR}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
