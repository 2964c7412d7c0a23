package pet

import (
	"errors"
	"strings"
	"testing"
)

func TestNormalizeAndValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        NewPet
		wantField string // empty: valid
		wantName  string
	}{
		{"minimal", NewPet{Name: "Rex", CategoryID: 1}, "", "Rex"},
		{"trimmed", NewPet{Name: "  Rex \t", CategoryID: 1}, "", "Rex"},
		{"unicode 100 runes", NewPet{Name: strings.Repeat("é", 100), CategoryID: 1}, "", strings.Repeat("é", 100)},
		{"max category", NewPet{Name: "Rex", CategoryID: 1<<63 - 1, Status: StatusSold}, "", "Rex"},
		{"empty name", NewPet{Name: "", CategoryID: 1}, "name", ""},
		{"blank name", NewPet{Name: " \t ", CategoryID: 1}, "name", ""},
		{"101 runes", NewPet{Name: strings.Repeat("a", 101), CategoryID: 1}, "name", ""},
		{"control char", NewPet{Name: "Re\x00x", CategoryID: 1}, "name", ""},
		{"newline inside", NewPet{Name: "Re\nx", CategoryID: 1}, "name", ""},
		{"DEL", NewPet{Name: "Re\x7fx", CategoryID: 1}, "name", ""},
		{"zero-width space only", NewPet{Name: "\u200b", CategoryID: 1}, "name", ""},
		{"byte order marks only", NewPet{Name: " \ufeff\ufeff ", CategoryID: 1}, "name", ""},
		{"invisible mix", NewPet{Name: "\u200b\u200c\u200d\u2060\u00ad\u034f\ufe0f\u3164\u3000\u00a0", CategoryID: 1}, "name", ""},
		{"combining mark only", NewPet{Name: "\u0301", CategoryID: 1}, "name", ""},
		{"invalid UTF-8", NewPet{Name: "R\xffx", CategoryID: 1}, "name", ""},
		{"visible among invisible", NewPet{Name: "\u200bR\u200b", CategoryID: 1}, "", "\u200bR\u200b"},
		{"emoji", NewPet{Name: "\U0001F436", CategoryID: 1}, "", "\U0001F436"},
		{"punctuation", NewPet{Name: "?", CategoryID: 1}, "", "?"},
		{"ideographic space trimmed", NewPet{Name: "\u3000\u72ac\u3000", CategoryID: 1}, "", "\u72ac"},
		{"zero category", NewPet{Name: "Rex"}, "categoryId", ""},
		{"negative category", NewPet{Name: "Rex", CategoryID: -5}, "categoryId", ""},
		{"bad status", NewPet{Name: "Rex", CategoryID: 1, Status: "lost"}, "status", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := tt.in.Normalize()
			err := n.Validate()
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if n.Name != tt.wantName {
					t.Errorf("name %q, want %q", n.Name, tt.wantName)
				}
				if tt.in.Status == "" && n.Status != StatusAvailable {
					t.Errorf("default status %q, want available", n.Status)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.wantField {
				t.Fatalf("error %v, want a validation error on %s", err, tt.wantField)
			}
			if !strings.HasPrefix(ve.Error(), tt.wantField+": ") {
				t.Errorf("message %q does not start with the field", ve.Error())
			}
		})
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	for _, s := range Statuses {
		got, err := ParseStatus("status", string(s))
		if err != nil || got != s {
			t.Errorf("ParseStatus(%q) = %q, %v", s, got, err)
		}
	}
	for _, bad := range []string{"", "Available", "SOLD", "lost"} {
		if _, err := ParseStatus("status", bad); err == nil {
			t.Errorf("ParseStatus(%q) accepted", bad)
		}
	}
}

func TestVisible(t *testing.T) {
	t.Parallel()
	for _, r := range "Rex7.-$\u00e9\u72ac\U0001F436\u2800" {
		if !Visible(r) {
			t.Errorf("%U is not visible", r)
		}
	}
	for _, r := range " \t\u00a0\u3000\u200b\u200c\u200d\u2060\ufeff\u00ad\u034f\u0301\ufe0f\U000E0100\u115f\u3164\uffa0\u061c\u202e\x00" {
		if Visible(r) {
			t.Errorf("%U is visible", r)
		}
	}
}
