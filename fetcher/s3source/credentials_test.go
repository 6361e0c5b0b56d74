package s3source_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestMissingCredentialsFailAtOnce: with no credentials in the
// environment, no shared files and no instance role, a pull's listing
// fails at once as access denied, naming where credentials are looked
// for, instead of being asked again as a transport fault (a host outside
// EC2, whose metadata service refuses the connection) or taken for a
// missing image (an EC2 instance without a role, whose metadata service
// answers 404).
func TestMissingCredentialsFailAtOnce(t *testing.T) {
	noRole := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(noRole.Close)
	refused := httptest.NewServer(http.NotFoundHandler())
	refused.Close()
	for name, imds := range map[string]string{"no metadata service": refused.URL, "instance without a role": noRole.URL} {
		t.Run(name, func(t *testing.T) {
			for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
				"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
				"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_EC2_METADATA_DISABLED"} {
				t.Setenv(k, "")
			}
			creds := filepath.Join(t.TempDir(), "credentials")
			t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "config"))
			t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
			t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds)
			srv := s3test.NewServer(t)
			srv.Put(t, "img/01.tar", payload(100))
			src, err := s3source.New(context.Background(), s3source.Config{Bucket: srv.Bucket, Region: "us-east-1", Endpoint: srv.URL, PathStyle: true})
			if err != nil {
				t.Fatal(err)
			}
			_, err = src.ResolveImage(context.Background(), "img")
			if !s3source.IsAccessDenied(err) {
				t.Fatalf("resolve without credentials: %v (kind %v), want access-denied", err, s3source.Classify(err))
			}
			for _, want := range []string{"no usable S3 credentials", "AWS_ACCESS_KEY_ID", creds, "instance role", "s3.anonymous"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if n := srv.TotalRequests(); n != 0 {
				t.Errorf("%d requests reached S3 without credentials, want 0", n)
			}
		})
	}
}

// TestCredentialServiceFaultIsRetried: a credential service that answers
// 503 or 429 (STS, a throttled metadata service) may answer the next
// request, so its failure stays retryable.
func TestCredentialServiceFaultIsRetried(t *testing.T) {
	for _, status := range []int{429, 503} {
		err := fmt.Errorf("list: %w", &s3source.CredentialsError{Err: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: errors.New("refused")}})
		if k := s3source.Classify(err); k != s3source.KindRetryable {
			t.Errorf("credential service answering %d: kind %v, want retryable", status, k)
		}
	}
}
