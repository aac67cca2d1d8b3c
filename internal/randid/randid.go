// Package randid makes the random parts of loam's ids and secrets
// (sandbox ids, API key ids and secrets): lowercase letters and digits,
// each equally likely, from crypto/rand.
package randid

import "crypto/rand"

// Alphabet is every character String draws from.
const Alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// String is n random characters of Alphabet.
func String(n int) string {
	out := make([]byte, 0, n)
	b := make([]byte, 2*n)
	for len(out) < n {
		if _, err := rand.Read(b); err != nil {
			panic(err) // crypto/rand never fails on Linux
		}
		for _, c := range b {
			// 252 is the largest multiple of 36 below 256: rejecting the
			// rest keeps every character equally likely.
			if c < 252 && len(out) < n {
				out = append(out, Alphabet[int(c)%len(Alphabet)])
			}
		}
	}
	return string(out)
}
