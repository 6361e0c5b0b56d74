package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// S3Region is the region the local S3 server signs for.
const S3Region = "us-east-1"

// S3 is a running versitygw on 127.0.0.1 with the posix backend in Dir.
type S3 struct {
	Endpoint  string // http://127.0.0.1:PORT
	Bucket    string
	AccessKey string
	SecretKey string
	Dir       string
	Proc      *Proc
}

// StartS3 starts versitygw (binary bin) with freshly generated root keys,
// its objects under dir/data and their metadata in the sidecar folder
// dir/meta (the guest kernel's tmpfs has no user xattrs), and waits until
// it listens. bucket is the bucket Seed will create.
func StartS3(ctx context.Context, bin, dir, bucket string) (*S3, error) {
	if err := LoopbackUp(ctx); err != nil {
		return nil, err
	}
	for _, d := range []string{"data", "meta"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("versitygw folder: %w", err)
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &S3{
		Endpoint:  fmt.Sprintf("http://127.0.0.1:%d", port),
		Bucket:    bucket,
		AccessKey: "AK" + randHex(9),
		SecretKey: randHex(20),
		Dir:       dir,
	}
	s.Proc, err = StartProc("versitygw", filepath.Join(dir, "versitygw.log"), []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		bin, "--port", fmt.Sprintf("127.0.0.1:%d", port), "--access", s.AccessKey, "--secret", s.SecretKey,
		"--region", S3Region, "posix", "--sidecar", filepath.Join(dir, "meta"), filepath.Join(dir, "data"))
	if err != nil {
		return nil, err
	}
	if err := waitDial(ctx, s.Proc, "tcp", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		_ = s.Proc.Stop(5 * time.Second)
		return nil, err
	}
	return s, nil
}

// Stop ends versitygw.
func (s *S3) Stop() error { return s.Proc.Stop(10 * time.Second) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port for the S3 server: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToUpper(hex.EncodeToString(b))
}

// client returns an S3 client for the server: signed with the root keys, or
// anonymous (unsigned) when anonymous is true.
func (s *S3) client(anonymous bool) *s3.Client {
	var creds aws.CredentialsProvider = credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, "")
	if anonymous {
		creds = aws.AnonymousCredentials{}
	}
	return s3.New(s3.Options{
		Region:       S3Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  creds,
		Retryer:      aws.NopRetryer{},
	})
}

// PublicReadPolicy is the bucket policy Seed puts: anyone may list the
// bucket and read its objects; nothing else is granted.
func PublicReadPolicy(bucket string) string {
	return fmt.Sprintf(`{"Version":"2012-10-17","Statement":[`+
		`{"Sid":"PublicList","Effect":"Allow","Principal":"*","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::%[1]s"]},`+
		`{"Sid":"PublicRead","Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::%[1]s/*"]}]}`, bucket)
}

// Uploaded is one object Seed put.
type Uploaded struct {
	Key  string
	Size int64
}

// Seed creates the bucket, puts PublicReadPolicy, uploads every .tar file
// under root with its path relative to root as the key (so
// root/images/debian/1.tar becomes images/debian/1.tar), then proves the
// server enforces what the demo relies on: an anonymous list and GET work
// (the policy) and an anonymous PUT and a wrongly signed GET are refused
// (real SigV4).
func (s *S3) Seed(ctx context.Context, root string) ([]Uploaded, error) {
	c := s.client(false)
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(s.Bucket)}); err != nil {
		return nil, fmt.Errorf("create bucket %s at %s: %w", s.Bucket, s.Endpoint, err)
	}
	if _, err := c.PutBucketPolicy(ctx, &s3.PutBucketPolicyInput{Bucket: aws.String(s.Bucket), Policy: aws.String(PublicReadPolicy(s.Bucket))}); err != nil {
		return nil, fmt.Errorf("put public-read policy on bucket %s: %w", s.Bucket, err)
	}
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasSuffix(path, ".tar") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list layer tarballs under %s: %w", root, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no .tar file under %s to upload", root)
	}
	sort.Strings(files)
	var up []Uploaded
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		key := filepath.ToSlash(rel)
		size, err := s.put(ctx, c, key, f)
		if err != nil {
			return nil, err
		}
		up = append(up, Uploaded{Key: key, Size: size})
	}
	if err := s.checkAccess(ctx, up[0].Key); err != nil {
		return nil, err
	}
	return up, nil
}

func (s *S3) put(ctx context.Context, c *s3.Client, key, path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("upload %s: %w", key, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("upload %s: %w", key, err)
	}
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s.Bucket), Key: aws.String(key), Body: f,
		ContentLength: aws.Int64(st.Size()), ContentType: aws.String("application/x-tar"),
	}); err != nil {
		return 0, fmt.Errorf("upload %s (%d bytes) to %s/%s: %w", path, st.Size(), s.Endpoint, s.Bucket, err)
	}
	return st.Size(), nil
}

func (s *S3) checkAccess(ctx context.Context, key string) error {
	anon := s.client(true)
	if _, err := anon.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(s.Bucket)}); err != nil {
		return fmt.Errorf("anonymous list of bucket %s refused despite the public-read policy: %w", s.Bucket, err)
	}
	out, err := anon.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.Bucket), Key: aws.String(key)})
	if err != nil {
		return fmt.Errorf("anonymous GET of %s refused despite the public-read policy: %w", key, err)
	}
	_, _ = io.Copy(io.Discard, out.Body)
	out.Body.Close()
	if _, err := anon.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s.Bucket), Key: aws.String("intruder"), Body: strings.NewReader("x")}); err == nil {
		return fmt.Errorf("anonymous PUT to bucket %s accepted: the server does not enforce its policy", s.Bucket)
	} else if !isAccessDenied(err) {
		return fmt.Errorf("anonymous PUT to bucket %s: want AccessDenied, got %w", s.Bucket, err)
	}
	bad := s3.New(s3.Options{Region: S3Region, BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true, Retryer: aws.NopRetryer{},
		Credentials: credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey+"X", "")})
	if _, err := bad.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s.Bucket), Key: aws.String("intruder"), Body: strings.NewReader("x")}); err == nil {
		return fmt.Errorf("PUT signed with a wrong secret accepted by %s: no SigV4 check", s.Endpoint)
	}
	return nil
}

func isAccessDenied(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "AccessDenied" {
		return true
	}
	var re interface{ HTTPStatusCode() int }
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusForbidden
}
