package api

import "testing"

func TestParseS3URL(t *testing.T) {
	for _, c := range []struct{ in, bucket, key string }{
		{"s3://images/debian/", "images", "debian/"},
		{"s3://images/a/b.tar", "images", "a/b.tar"},
	} {
		b, k, err := ParseS3URL(c.in)
		if err != nil || b != c.bucket || k != c.key {
			t.Errorf("ParseS3URL(%q) = %q, %q, %v", c.in, b, k, err)
		}
	}
	for _, bad := range []string{"images/a.tar", "s3://", "s3://bucket", "s3:///key"} {
		if _, _, err := ParseS3URL(bad); err == nil {
			t.Errorf("ParseS3URL(%q) accepted", bad)
		}
	}
}
