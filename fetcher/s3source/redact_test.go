package s3source

import "testing"

func TestRedactURLKeepsURLsWithoutUserInformation(t *testing.T) {
	for in, want := range map[string]string{
		"https://s3.example.com/a@b":            "https://s3.example.com/a@b",
		"http://AKID:s3cr3t@127.0.0.1:9000/x@y": "http://127.0.0.1:9000/x@y",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
