package api

import (
	"maps"
	"regexp"
	"slices"
	"unicode/utf8"
)

// Labels are key=value pairs a sandbox is given at creation and listed by
// (GET /v1/sandboxes?label=key=value).
const (
	// MaxLabels is the most labels a sandbox can have, and so the most
	// label filters a list can take.
	MaxLabels = 64
	// MaxLabelValue is the longest a label's value can be, in bytes.
	MaxLabelValue = 255
	// LabelValueRule says what ValidLabelValue accepts, for error messages.
	LabelValueRule = "valid UTF-8 of at most 255 bytes"
	// LabelKeyRule says what ValidLabelKey accepts, for error messages.
	LabelKeyRule = "1-63 characters of letters, digits and . _ / -, starting with a letter or digit"
)

var labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)

// ValidLabelKey reports whether k can be a label's key (see LabelKeyRule).
func ValidLabelKey(k string) bool { return labelKeyRE.MatchString(k) }

// ValidLabelValue reports whether v can be a label's value (see
// LabelValueRule). Invalid UTF-8 is refused rather than stored: JSON
// cannot carry it, so a label that held it could not be listed back.
func ValidLabelValue(v string) bool { return len(v) <= MaxLabelValue && utf8.ValidString(v) }

// CheckLabels refuses labels a sandbox (or a key's selector) cannot have,
// naming the first bad one in key order.
func CheckLabels(labels map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if !ValidLabelKey(k) {
			return Errorf(CodeInvalid, "labels: key %q: %s", k, LabelKeyRule)
		}
		if !ValidLabelValue(labels[k]) {
			return Errorf(CodeInvalid, "labels: the value of %s: %s", k, LabelValueRule)
		}
	}
	if len(labels) > MaxLabels {
		return Errorf(CodeInvalid, "labels: at most %d labels", MaxLabels)
	}
	return nil
}
