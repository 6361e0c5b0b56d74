package main

import (
	"context"
	"fmt"
	"runtime"
)

func init() {
	register(&command{
		name:    "version",
		summary: "print the version and build information",
		run: func(ctx context.Context, args []string) error {
			fs := newFlagSet("version", "version", "Prints the version of this binary, the Go toolchain and the platform.")
			if err := parseFlags(fs, args); err != nil {
				return err
			}
			fmt.Printf("containerd-flyio-snapshotter %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	})
}
