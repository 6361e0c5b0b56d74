package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
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

// StartS3 starts versitygw (binary bin) on 127.0.0.1 with the root keys
// accessKey/secretKey (generated when empty), its objects under dir/data
// and their metadata in the sidecar folder dir/meta (no xattrs needed: the
// VM's tmpfs and 9p have none), its log in logDir, and waits until it
// listens. A dir made by
// SeedStore is served as it is. bucket names the bucket Seed creates or
// SeedStore created.
func StartS3(ctx context.Context, bin, dir, logDir, bucket, accessKey, secretKey string) (*S3, error) {
	if err := LoopbackUp(ctx); err != nil {
		return nil, err
	}
	for _, d := range []string{"data", "meta"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("versitygw folder: %w", err)
		}
	}
	if accessKey == "" {
		accessKey, secretKey = "AK"+randHex(9), randHex(20)
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("versitygw log folder: %w", err)
	}
	p, addr, err := ServeOnFreePort(ctx, func(addr string) (*Proc, error) {
		return StartServing(ctx, "versitygw", filepath.Join(logDir, "versitygw.log"), []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, "tcp", addr,
			bin, "--port", addr, "--access", accessKey, "--secret", secretKey,
			"--region", S3Region, "--quiet", "posix", "--sidecar", filepath.Join(dir, "meta"), filepath.Join(dir, "data"))
	})
	if err != nil {
		return nil, err
	}
	return &S3{
		Endpoint:  "http://" + addr,
		Bucket:    bucket,
		AccessKey: accessKey,
		SecretKey: secretKey,
		Dir:       dir,
		Proc:      p,
	}, nil
}

// SeedStore makes, once, a versitygw store under dir holding the bucket
// with its public-read policy and every layer under imageDir (see Seed),
// with generated root keys kept in dir/keys (mode 0600): versitygw runs on
// the host for this, where hashing and copying are fast, and the VM then
// serves the store (OpenStore). A store marked complete is kept as is.
func SeedStore(ctx context.Context, bin, dir, bucket, imageDir string) ([]Uploaded, error) {
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		return nil, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("S3 store %s: %w", dir, err)
	}
	s, err := StartS3(ctx, bin, dir, filepath.Join(dir, "log"), bucket, "", "")
	if err != nil {
		return nil, err
	}
	up, err := s.Seed(ctx, imageDir)
	if serr := s.Stop(); err == nil && serr != nil {
		err = serr
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "keys"), []byte(s.AccessKey+" "+s.SecretKey+"\n"), 0o600)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("S3 store %s: %w", dir, err)
	}
	return up, nil
}

// OpenStore starts versitygw on a store SeedStore made, with its keys, and
// checks what the run relies on (CheckAccess).
func OpenStore(ctx context.Context, bin, dir, logDir, bucket string) (*S3, error) {
	b, err := os.ReadFile(filepath.Join(dir, "keys"))
	if err != nil {
		return nil, fmt.Errorf("S3 store %s not seeded (integration/e2e/prepare.sh makes it): %w", dir, err)
	}
	k := strings.Fields(string(b))
	if len(k) != 2 {
		return nil, fmt.Errorf("S3 store %s: keys file is not \"ACCESS SECRET\"", dir)
	}
	s, err := StartS3(ctx, bin, dir, logDir, bucket, k[0], k[1])
	if err != nil {
		return nil, err
	}
	if err := s.CheckAccess(ctx); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// Stop ends versitygw.
func (s *S3) Stop() error { return s.Proc.Stop(10 * time.Second) }

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

// Seed creates the bucket, puts PublicReadPolicy, uploads every layer file
// (.tar, .tar.gz, .tar.zst) under root/images with its path relative to root as the key (so
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
	err := filepath.WalkDir(filepath.Join(root, "images"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && s3source.IsLayerKey(path) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list layer tarballs under %s: %w", root, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no layer file (.tar, .tar.gz, .tar.zst) under %s to upload", root)
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
	if err := s.CheckAccess(ctx); err != nil {
		return nil, err
	}
	return up, nil
}

// Upload puts the file at path under key in the bucket Seed made, signed,
// and returns its size: an object added while the run goes on.
func (s *S3) Upload(ctx context.Context, key, path string) (int64, error) {
	return s.put(ctx, s.client(false), key, path)
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

// CheckAccess proves the server enforces what the run relies on: an
// anonymous list and GET (of the smallest object) succeed through the
// public-read policy, an anonymous PUT is refused with AccessDenied, and a
// PUT signed with a wrong secret is refused (real SigV4).
func (s *S3) CheckAccess(ctx context.Context) error {
	anon := s.client(true)
	list, err := anon.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(s.Bucket)})
	if err != nil {
		return fmt.Errorf("anonymous list of bucket %s refused despite the public-read policy: %w", s.Bucket, err)
	}
	if len(list.Contents) == 0 {
		return fmt.Errorf("bucket %s at %s is empty", s.Bucket, s.Endpoint)
	}
	key := aws.ToString(list.Contents[0].Key)
	for _, o := range list.Contents {
		if aws.ToInt64(o.Size) < aws.ToInt64(list.Contents[0].Size) {
			key = aws.ToString(o.Key)
		}
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
