package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The runtime contract of the image; deploy/Dockerfile states the same
// (TestDockerfileAgrees keeps them together) and the chart relies on it.
const (
	user       = "65532:65532"
	entrypoint = "/petstore"
	cmd        = "serve"
	apiPort    = "8080/tcp"
	opsPort    = "9090/tcp"
	caBundle   = "etc/ssl/certs/ca-certificates.crt"
	binaryPath = "petstore"
)

// staticLabels are the OCI labels whose values do not depend on the build.
var staticLabels = map[string]string{
	"org.opencontainers.image.title":         "petstore",
	"org.opencontainers.image.description":   "Animal Store API v1 with Redis-backed rate limiting shared by all replicas",
	"org.opencontainers.image.source":        "https://github.com/animal-store/petstore",
	"org.opencontainers.image.url":           "https://github.com/animal-store/petstore",
	"org.opencontainers.image.documentation": "https://github.com/animal-store/petstore/blob/main/deploy/README.md",
}

// buildSpec is everything an image is made of. Equal specs give byte-equal
// images: no clock, host file or map order is read while building.
type buildSpec struct {
	Binary   []byte    // the static linux petstore executable
	Version  string    // the binary's version, for the version label
	Revision string    // the commit, for the revision label
	Created  time.Time // the commit's time: every timestamp in the image
}

// buildImage returns the release image: one layer holding the binary, a
// passwd and group entry for 65532 (nonroot), the CA certificates and an
// empty /tmp.
func buildImage(s buildSpec) (v1.Image, error) {
	if s.Version == "" || s.Revision == "" {
		return nil, errors.New("version and revision are required")
	}
	if s.Created.IsZero() {
		return nil, errors.New("created time is required")
	}
	created := s.Created.UTC().Truncate(time.Second)
	arch, err := staticLinuxArch(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("binary: %w", err)
	}
	content, err := layerTar(s.Binary, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(content)), nil },
		tarball.WithCompressionLevel(gzip.BestCompression),
		tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressedCaching,
	)
	if err != nil {
		return nil, err
	}

	labels := map[string]string{
		"org.opencontainers.image.version":  s.Version,
		"org.opencontainers.image.revision": s.Revision,
		"org.opencontainers.image.created":  created.Format(time.RFC3339),
	}
	for k, v := range staticLabels {
		labels[k] = v
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Config: v1.Config{
			User:         user,
			Entrypoint:   []string{entrypoint},
			Cmd:          []string{cmd},
			ExposedPorts: map[string]struct{}{apiPort: {}, opsPort: {}},
			WorkingDir:   "/",
			Labels:       labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "deploy/image: petstore " + s.Version,
			Comment:   "static binary, nonroot user 65532, CA certificates",
		},
	})
	if err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, v1.Time{Time: created})
}

// staticLinuxArch returns the GOARCH of a static linux ELF executable, and
// an error for anything that would need a file the image lacks (a dynamic
// loader or shared libraries).
func staticLinuxArch(bin []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return "", fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("ELF type %s is not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", errors.New("dynamically linked (has an interpreter): build with CGO_ENABLED=0")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return "", fmt.Errorf("needs shared libraries %v: build with CGO_ENABLED=0", libs)
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	default:
		return "", fmt.Errorf("unsupported machine %s", f.Machine)
	}
}

// passwd and group know root and nonroot (65532), the user the image runs as.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group  = "root:x:0:\nnonroot:x:65532:\n"
)

// caCertificates is Mozilla's root store as shipped by
// golang.org/x/crypto/x509roots/fallback, PEM-encoded: its version is pinned
// by go.sum, so the bundle does not depend on the building host. Roots that
// NSS trusts only for certificates issued before a date are left out: a PEM
// file cannot carry that constraint.
func caCertificates() ([]byte, int) {
	var buf bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate})
		n++
	}
	return buf.Bytes(), n
}

// layerTar is the uncompressed layer: every entry owned by root, stamped
// with the commit's time, in a fixed order.
func layerTar(binary []byte, created time.Time) ([]byte, error) {
	certs, _ := caCertificates()
	type entry struct {
		name string
		mode int64
		dir  bool
		data []byte
	}
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: caBundle, mode: 0o644, data: certs},
		{name: binaryPath, mode: 0o755, data: binary},
		// Kubernetes mounts an emptyDir here (the chart does); with a
		// container engine and no volume it is the writable scratch space.
		{name: "tmp/", mode: 0o1777, dir: true},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			ModTime: created,
			Format:  tar.FormatUSTAR,
			Uname:   "root",
			Gname:   "root",
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeArchive writes img as one tar file that is at once an OCI image
// layout (oci-layout, index.json, blobs/sha256/...: what `docker save`
// writes since Docker 25, `podman load` and `skopeo copy oci-archive:`
// read, and `crane push` reads once unpacked into a directory) and a
// docker-archive (manifest.json naming the same blobs: what older
// `docker load`, `podman load` and `crane push FILE` read). ref names the
// image in both indexes (for example ghcr.io/animal-store/petstore:1.2.0).
func writeArchive(w io.Writer, img v1.Image, ref string, created time.Time) error {
	t, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference: %w (want registry/repository:tag)", err)
	}
	repo, tag := t.Context().Name(), t.TagStr()
	rawManifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	manifest, err := img.Manifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}

	type blob struct {
		hash v1.Hash
		data []byte
	}
	blobs := []blob{{manifest.Config.Digest, rawConfig}}
	var layerPaths []string
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		blobs = append(blobs, blob{h, data})
		layerPaths = append(layerPaths, blobPath(h))
	}
	blobs = append(blobs, blob{digest, rawManifest})
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].hash.Hex < blobs[j].hash.Hex })

	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: manifest.MediaType,
			Digest:    digest,
			Size:      int64(len(rawManifest)),
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": tag,
				"io.containerd.image.name":          repo + ":" + tag,
			},
		}},
	})
	if err != nil {
		return err
	}
	dockerManifest, err := json.Marshal([]tarball.Descriptor{{
		Config:   blobPath(manifest.Config.Digest),
		RepoTags: []string{repo + ":" + tag},
		Layers:   layerPaths,
	}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		h := &tar.Header{Name: name, Mode: 0o644, ModTime: created, Format: tar.FormatUSTAR}
		if data == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	if err := put("manifest.json", dockerManifest); err != nil {
		return err
	}
	if err := put("blobs/", nil); err != nil {
		return err
	}
	if err := put("blobs/sha256/", nil); err != nil {
		return err
	}
	for _, b := range blobs {
		if err := put(blobPath(b.hash), b.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func blobPath(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }
