package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// helloWorld builds, under dir, the anchor of the CLI's start-up
// benchmarks: the smallest static Go program that writes a line, so that
// what the CLI takes above it is what the CLI itself links and does. It
// returns the program's path. It builds with the default flags, so that the
// standard library comes from the build cache (in the VM, the host's).
func helloWorld(dir string) (string, error) {
	src := filepath.Join(dir, "hello")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	files := map[string]string{
		"go.mod":  "module hello\n\ngo 1.25\n",
		"main.go": "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"hello\\n\") }\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(text), 0o644); err != nil {
			return "", err
		}
	}
	bin := filepath.Join(dir, "hello-world")
	cmd := exec.Command("go", "build", "-ldflags=-s -w", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the hello-world anchor: %w: %s", err, out)
	}
	return bin, nil
}
