// Command image builds petstore's release image without a container engine:
// the static binary that `make build` produces, a passwd and group entry for
// the nonroot user 65532, Mozilla's CA certificates, and the runtime
// contract deploy/Dockerfile states (user, entrypoint, cmd, ports, OCI
// labels). The result is one tar file that is both an OCI image layout and a
// docker-archive, so docker load, podman load and crane push accept it. Equal
// inputs give a byte-equal file, hence the same digest: every timestamp is
// the commit's.
//
// It is its own module so the service's go.mod does not carry
// go-containerregistry. `make image` runs it; `make image-test` runs its
// tests, which start the image as Kubernetes would (see runtime_test.go).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	binary := fs.String("binary", "", "static linux petstore binary (make build)")
	version := fs.String("version", "", "version the binary was stamped with")
	revision := fs.String("revision", "", "commit the binary was built from")
	created := fs.String("created", "", "commit time, Unix seconds (git log -1 --format=%ct)")
	ref := fs.String("ref", "", "name of the image in the archive, registry/repository:tag")
	out := fs.String("o", "", "archive to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, f := range []struct{ name, value string }{
		{"binary", *binary}, {"version", *version}, {"revision", *revision},
		{"created", *created}, {"ref", *ref}, {"o", *out},
	} {
		if f.value == "" {
			return fmt.Errorf("-%s is required", f.name)
		}
	}
	secs, err := strconv.ParseInt(*created, 10, 64)
	if err != nil || secs <= 0 {
		return fmt.Errorf("-created %q: want Unix seconds", *created)
	}
	bin, err := os.ReadFile(*binary)
	if err != nil {
		return err
	}
	img, err := buildImage(buildSpec{
		Binary:   bin,
		Version:  *version,
		Revision: *revision,
		Created:  time.Unix(secs, 0),
	})
	if err != nil {
		return err
	}

	// Write next to the target and rename, so a failed build never leaves
	// a truncated archive under the final name.
	tmp, err := os.CreateTemp(dirOf(*out), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	err = writeArchive(tmp, img, *ref, time.Unix(secs, 0))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return err
	}

	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := compressedSize(img)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n  %s@%s\n  compressed size %d bytes (%.1f MB)\n", *out, *ref, digest, size, float64(size)/1e6)
	return nil
}

// compressedSize is what a registry stores and a node pulls: the manifest,
// the config and the compressed layers.
func compressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	total := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		total += l.Size
	}
	return total, nil
}

// dirOf is the directory of path p, "." for a bare file name.
func dirOf(p string) string {
	if d := filepath.Dir(p); d != "" {
		return d
	}
	return "."
}
