package s3source

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
)

// CredentialsError is the error of a request that could not be signed
// because the SDK's default chain found no usable credentials. It names
// where the chain looks, so an operator sees what to set instead of an
// error from the last place tried (usually the EC2 instance metadata
// service, which a host outside EC2 does not have).
type CredentialsError struct {
	// Err is the chain's own error.
	Err error
}

// Error names the places the chain looked and the chain's error.
func (e *CredentialsError) Error() string {
	return fmt.Sprintf("no usable S3 credentials; the AWS default chain looks, in order, in the environment "+
		"(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN), "+
		"the shared config and credentials files (%s, %s), a container's credentials endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI), "+
		"and an EC2 instance role; set one, or s3.anonymous = true for a public bucket: %v",
		sharedFile("AWS_CONFIG_FILE", config.DefaultSharedConfigFilename()),
		sharedFile("AWS_SHARED_CREDENTIALS_FILE", config.DefaultSharedCredentialsFilename()), e.Err)
}

// Unwrap returns the chain's error.
func (e *CredentialsError) Unwrap() error { return e.Err }

// sharedFile is the shared file the SDK reads: the one env names, else def.
func sharedFile(env, def string) string {
	if f := os.Getenv(env); f != "" {
		return f
	}
	return def
}

// credentialsProvider marks the errors of the provider it wraps as
// CredentialsError, which Classify tells apart from S3's own answers: the
// chain's last link, the instance metadata service, fails with a refused
// connection or a 404 on a host without a role, which would otherwise
// read as a transport fault worth retrying or a missing image.
type credentialsProvider struct {
	aws.CredentialsProvider
}

// Retrieve returns the wrapped provider's credentials or its error as a
// CredentialsError.
func (p credentialsProvider) Retrieve(ctx context.Context) (aws.Credentials, error) {
	c, err := p.CredentialsProvider.Retrieve(ctx)
	if err != nil {
		return c, &CredentialsError{Err: err}
	}
	return c, nil
}

// IsCredentialsProvider tells the SDK what the wrapped provider is, as
// aws.CredentialsCache does for the provider it caches.
func (p credentialsProvider) IsCredentialsProvider(target aws.CredentialsProvider) bool {
	return aws.IsCredentialsProvider(p.CredentialsProvider, target)
}
