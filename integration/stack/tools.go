package stack

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Tool returns the path of program bin that integration/tools/build.sh
// built from module at the version pinned in the go.mod of folder modDir
// (relative to integration/tools: "" for containerd's, "nerdctl",
// "registry"): .cache/tools/<name>-<version>/<bin> under repo. It fails,
// saying how to build it, when the binary is missing.
func Tool(repo, modDir, module, name, bin string) (string, error) {
	gomod := filepath.Join(repo, "integration/tools", modDir, "go.mod")
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("%s version: %w", name, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == module {
			path := filepath.Join(repo, ".cache/tools", name+"-"+f[1], bin)
			if _, err := os.Stat(path); err != nil {
				return "", fmt.Errorf("%s %s not built (run integration/tools/build.sh on the host, before the VM): %w", bin, f[1], err)
			}
			return path, nil
		}
	}
	return "", fmt.Errorf("%s does not require %s", gomod, module)
}

// ReadInputs reads a file of KEY=VALUE lines, which the prepare.sh
// scripts of integration/e2e and integration/upgrade write on the host to
// tell the tests in the VM what they made. Without the file the error
// says to run prepare (the script's path) first.
func ReadInputs(path, prepare string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("run %s on the host first: %w", prepare, err)
	}
	in := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			in[k] = v
		}
	}
	return in, nil
}

// Versitygw returns the versitygw that integration/e2e/prepare.sh
// installed on the host and recorded in .cache/e2e/inputs under repo (the
// VM sees the host's files read-only), or an error saying how to make it.
func Versitygw(repo string) (string, error) {
	path := filepath.Join(repo, ".cache/e2e/inputs")
	in, err := ReadInputs(path, "integration/e2e/prepare.sh")
	if err != nil {
		return "", fmt.Errorf("versitygw: %w", err)
	}
	v, ok := in["versitygw"]
	if !ok {
		return "", fmt.Errorf("%s names no versitygw", path)
	}
	if _, err := os.Stat(v); err != nil {
		return "", fmt.Errorf("versitygw of %s: %w", path, err)
	}
	return v, nil
}
