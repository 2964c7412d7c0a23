package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var (
	smallBinOnce sync.Once
	smallBin     []byte
	smallBinErr  error
)

// smallBinary is a tiny static Go program, built once: the unit tests need a
// real static executable, not petstore's 20 MB one.
func smallBinary(t *testing.T) []byte {
	t.Helper()
	smallBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "image-test-bin-")
		if err != nil {
			smallBinErr = err
			return
		}
		defer os.RemoveAll(dir)
		src := "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n"
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
			smallBinErr = err
			return
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.26\n"), 0o644); err != nil {
			smallBinErr = err
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-o", "hello", ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			smallBinErr = errors.New(string(out))
			return
		}
		smallBin, smallBinErr = os.ReadFile(filepath.Join(dir, "hello"))
	})
	if smallBinErr != nil {
		t.Fatalf("building a small static binary: %v", smallBinErr)
	}
	return smallBin
}

var testCreated = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func testSpec(t *testing.T) buildSpec {
	return buildSpec{Binary: smallBinary(t), Version: "1.2.3", Revision: "0123456789abcdef0123456789abcdef01234567", Created: testCreated}
}

func mustBuild(t *testing.T, s buildSpec) v1.Image {
	t.Helper()
	img, err := buildImage(s)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func archiveBytes(t *testing.T, img v1.Image, ref string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := writeArchive(&buf, img, ref, testCreated); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digestOf(t *testing.T, img interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestBuildIsReproducible(t *testing.T) {
	t.Parallel()
	const ref = "ghcr.io/animal-store/petstore:1.2.3"
	a, b := mustBuild(t, testSpec(t)), mustBuild(t, testSpec(t))
	if da, db := digestOf(t, a), digestOf(t, b); da != db {
		t.Fatalf("two builds of the same inputs: digests %s and %s", da, db)
	}
	if !bytes.Equal(archiveBytes(t, a, ref), archiveBytes(t, b, ref)) {
		t.Fatal("two builds of the same inputs wrote different archives")
	}

	// Every input is in the digest: a build that ignored one would be
	// "reproducible" for the wrong reason.
	base := digestOf(t, a)
	for name, change := range map[string]func(*buildSpec){
		"binary":   func(s *buildSpec) { s.Binary = append(slices.Clone(s.Binary), 0) },
		"version":  func(s *buildSpec) { s.Version = "1.2.4" },
		"revision": func(s *buildSpec) { s.Revision = strings.Repeat("f", 40) },
		"created":  func(s *buildSpec) { s.Created = s.Created.Add(time.Second) },
	} {
		s := testSpec(t)
		change(&s)
		if digestOf(t, mustBuild(t, s)) == base {
			t.Errorf("changing the %s left the digest unchanged", name)
		}
	}
}

func TestBuildRejects(t *testing.T) {
	t.Parallel()
	dynamic, err := os.ReadFile("/bin/true") // Debian's is dynamically linked
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		change func(*buildSpec)
		want   string
	}{
		"not ELF":     {func(s *buildSpec) { s.Binary = []byte("#!/bin/sh\necho hi\n") }, "not an ELF executable"},
		"dynamic":     {func(s *buildSpec) { s.Binary = dynamic }, "CGO_ENABLED=0"},
		"no version":  {func(s *buildSpec) { s.Version = "" }, "version and revision are required"},
		"no revision": {func(s *buildSpec) { s.Revision = "" }, "version and revision are required"},
		"no time":     {func(s *buildSpec) { s.Created = time.Time{} }, "created time is required"},
	} {
		s := testSpec(t)
		tc.change(&s)
		_, err := buildImage(s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got error %v, want one containing %q", name, err, tc.want)
		}
	}
}

// layerEntry is one file of the image's filesystem.
type layerEntry struct {
	Name     string
	Type     byte
	Mode     int64
	UID, GID int
	ModTime  time.Time
	Data     []byte
}

func imageFiles(t *testing.T, img v1.Image) []layerEntry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	var out []layerEntry
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, layerEntry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime.UTC(), data})
	}
}

func TestImageContents(t *testing.T) {
	t.Parallel()
	spec := testSpec(t)
	files := imageFiles(t, mustBuild(t, spec)) // names cleaned: "etc", not "etc/"
	type shape struct {
		Name string
		Type byte
		Mode int64
	}
	var got []shape
	for _, f := range files {
		got = append(got, shape{f.Name, f.Type, f.Mode})
		if f.UID != 0 || f.GID != 0 {
			t.Errorf("%s: owned by %d:%d, want root (the nonroot user must not be able to change it)", f.Name, f.UID, f.GID)
		}
		if !f.ModTime.Equal(testCreated) {
			t.Errorf("%s: mtime %s, want the commit time %s", f.Name, f.ModTime, testCreated)
		}
	}
	want := []shape{
		{"etc", tar.TypeDir, 0o755},
		{"etc/group", tar.TypeReg, 0o644},
		{"etc/passwd", tar.TypeReg, 0o644},
		{"etc/ssl", tar.TypeDir, 0o755},
		{"etc/ssl/certs", tar.TypeDir, 0o755},
		{"etc/ssl/certs/ca-certificates.crt", tar.TypeReg, 0o644},
		{"petstore", tar.TypeReg, 0o755},
		{"tmp", tar.TypeDir, 0o1777},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("image files:\n got %v\nwant %v", got, want)
	}

	byName := map[string][]byte{}
	for _, f := range files {
		byName[f.Name] = f.Data
	}
	if !bytes.Equal(byName["petstore"], spec.Binary) {
		t.Error("/petstore is not the binary given")
	}
	if !strings.Contains(string(byName["etc/passwd"]), "\nnonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot entry for 65532:\n%s", byName["etc/passwd"])
	}
	if !strings.Contains(string(byName["etc/group"]), "\nnonroot:x:65532:") {
		t.Errorf("/etc/group has no nonroot entry for 65532:\n%s", byName["etc/group"])
	}

	// The CA bundle: only CA certificates, and enough of them to be
	// Mozilla's store (around 150), each parsed as Go's TLS client will.
	rest, n := byName["etc/ssl/certs/ca-certificates.crt"], 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("CA bundle certificate %d: %v", n, err)
		}
		if !c.IsCA {
			t.Errorf("CA bundle holds a non-CA certificate: %s", c.Subject)
		}
		n++
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		t.Error("CA bundle has trailing data that is not PEM")
	}
	if _, want := caCertificates(); n != want || n < 100 {
		t.Errorf("CA bundle holds %d certificates, want the %d unconstrained roots (>= 100)", n, want)
	}
}

func TestImageConfig(t *testing.T) {
	t.Parallel()
	img := mustBuild(t, testSpec(t))
	checkConfig(t, img, "1.2.3", testSpec(t).Revision, testCreated)
}

// checkConfig checks the runtime contract and metadata of an image.
func checkConfig(t *testing.T, img v1.Image, version, revision string, created time.Time) {
	t.Helper()
	if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s (%v), want %s", mt, err, types.OCIManifestSchema1)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %s, want %s", m.Config.MediaType, types.OCIConfigJSON)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("layers %+v, want one %s", m.Layers, types.OCILayer)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/petstore"}) || !slices.Equal(c.Cmd, []string{"serve"}) {
		t.Errorf("entrypoint %q cmd %q, want [/petstore] [serve]", c.Entrypoint, c.Cmd)
	}
	if !reflect.DeepEqual(c.ExposedPorts, map[string]struct{}{"8080/tcp": {}, "9090/tcp": {}}) {
		t.Errorf("exposed ports %v, want 8080/tcp and 9090/tcp", c.ExposedPorts)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if !cf.Created.Time.Equal(created) {
		t.Errorf("created %s, want %s", cf.Created.Time, created)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
		"org.opencontainers.image.created":  created.UTC().Format(time.RFC3339),
	}
	for k, v := range staticLabels {
		wantLabels[k] = v
	}
	if !reflect.DeepEqual(c.Labels, wantLabels) {
		t.Errorf("labels:\n got %v\nwant %v", c.Labels, wantLabels)
	}
	if len(cf.History) != len(cf.RootFS.DiffIDs) {
		t.Errorf("%d history entries for %d layers", len(cf.History), len(cf.RootFS.DiffIDs))
	}
}

// TestArchiveLoads reads the archive the ways docker load, podman load and
// crane push do, and pushes it to a registry.
func TestArchiveLoads(t *testing.T) {
	t.Parallel()
	const ref = "ghcr.io/animal-store/petstore:1.2.3"
	img := mustBuild(t, testSpec(t))
	dir := t.TempDir()
	archive := filepath.Join(dir, "petstore.tar")
	if err := os.WriteFile(archive, archiveBytes(t, img, ref), 0o644); err != nil {
		t.Fatal(err)
	}
	checkArchive(t, archive, img, ref)
}

// checkArchive checks that the archive at path holds img under ref, both as
// an OCI image layout and as a docker-archive, and that both push.
func checkArchive(t *testing.T, path string, img v1.Image, ref string) {
	t.Helper()
	want := digestOf(t, img)
	wantCfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	wantLayers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	wantDiffID, err := wantLayers[0].DiffID()
	if err != nil {
		t.Fatal(err)
	}

	// docker-archive (manifest.json): docker load, podman load, crane push FILE.
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	dimg, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatalf("as a docker-archive: %v", err)
	}
	if err := validate.Image(dimg); err != nil {
		t.Fatalf("as a docker-archive: %v", err)
	}
	if cfg, err := dimg.ConfigName(); err != nil || cfg != wantCfg {
		t.Errorf("docker-archive config %s (%v), want %s", cfg, err, wantCfg)
	}
	dlayers, err := dimg.Layers()
	if err != nil || len(dlayers) != 1 {
		t.Fatalf("docker-archive layers %v (%v)", dlayers, err)
	}
	if d, err := dlayers[0].DiffID(); err != nil || d != wantDiffID {
		t.Errorf("docker-archive layer %s (%v), want %s", d, err, wantDiffID)
	}

	// OCI image layout: docker load (25+), podman load, skopeo oci-archive:,
	// crane push DIR once unpacked.
	dir := t.TempDir()
	untar(t, path, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("as an OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != want {
		t.Fatalf("index.json %+v, want one manifest %s", im.Manifests, want)
	}
	ann := im.Manifests[0].Annotations
	if ann["org.opencontainers.image.ref.name"] != tag.TagStr() || ann["io.containerd.image.name"] != tag.Name() {
		t.Errorf("index.json annotations %v, want the tag %s and the name %s", ann, tag.TagStr(), tag.Name())
	}
	limg, err := idx.Image(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(limg); err != nil {
		t.Fatalf("as an OCI layout: %v", err)
	}

	// Push both ways to a registry. The layout keeps the image's digest;
	// the docker-archive route (crane push FILE) rewrites the manifest with
	// Docker media types but the same config and layer.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	ociRef, err := name.NewTag(host + "/petstore:oci")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ociRef, limg); err != nil {
		t.Fatalf("push from the layout: %v", err)
	}
	pulled, err := remote.Image(ociRef)
	if err != nil {
		t.Fatal(err)
	}
	if got := digestOf(t, pulled); got != want {
		t.Errorf("pushed from the layout as %s, want %s", got, want)
	}
	dockerRef, err := name.NewTag(host + "/petstore:docker")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dockerRef, dimg); err != nil {
		t.Fatalf("push from the docker-archive: %v", err)
	}
	pulled, err = remote.Image(dockerRef)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := pulled.ConfigName(); err != nil || cfg != wantCfg {
		t.Errorf("pushed from the docker-archive with config %s (%v), want %s", cfg, err, wantCfg)
	}
}

// untar unpacks the archive at path into dir (flat files and directories
// only: that is all an image archive holds).
func untar(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("archive entry %q escapes the directory", h.Name)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("archive entry %q has type %c", h.Name, h.Typeflag)
		}
	}
}

func TestArchiveRejectsBadReference(t *testing.T) {
	t.Parallel()
	img := mustBuild(t, testSpec(t))
	for _, ref := range []string{"", "petstore", "ghcr.io/animal-store/petstore", "ghcr.io/Animal/petstore:1", "ghcr.io/a/petstore:bad tag"} {
		if err := writeArchive(io.Discard, img, ref, testCreated); err == nil {
			t.Errorf("reference %q accepted", ref)
		}
	}
}

func TestRunChecksFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "petstore")
	if err := os.WriteFile(bin, smallBinary(t), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	good := []string{"-binary", bin, "-version", "1.2.3", "-revision", "abc", "-created", "1795000000", "-ref", "ghcr.io/animal-store/petstore:1.2.3", "-o", out}
	var stdout bytes.Buffer
	if err := run(good, &stdout); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "ghcr.io/animal-store/petstore:1.2.3@sha256:") {
		t.Errorf("output does not name the digest: %s", stdout.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	with := func(flag, value string) []string {
		args := slices.Clone(good)
		i := slices.Index(args, flag)
		args[i+1] = value
		return args
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{with("-binary", ""), "-binary is required"},
		{with("-created", "yesterday"), "want Unix seconds"},
		{with("-created", "-5"), "want Unix seconds"},
		{with("-ref", "petstore"), "image reference"},
		{with("-binary", filepath.Join(dir, "missing")), "no such file"},
		{with("-o", filepath.Join(dir, "no", "such", "dir.tar")), "no such file"},
		{append(slices.Clone(good), "extra"), "unexpected arguments"},
	} {
		err := run(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run %q: got %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	// A failed build leaves nothing behind: no archive under the target's
	// name, no temporary file.
	failed := filepath.Join(dir, "failed.tar")
	if err := run(with("-o", failed), io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(failed); err != nil {
		t.Fatal(err)
	}
	bad := with("-o", failed)
	bad[slices.Index(bad, "-ref")+1] = "ghcr.io/animal-store/petstore"
	if err := run(bad, io.Discard); err == nil {
		t.Fatal("a reference without a tag was accepted")
	}
	if _, err := os.Stat(failed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed build left %s: %v", failed, err)
	}
	if entries, _ := filepath.Glob(filepath.Join(dir, ".image-*")); len(entries) != 0 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

// TestDockerfileAgrees keeps deploy/Dockerfile, for users with a container
// engine, and the built image on the same runtime contract and labels.
func TestDockerfileAgrees(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	final := finalStage(string(text))
	last := func(cmd string) string {
		var v string
		for _, in := range final {
			if in.cmd == cmd {
				v = in.args
			}
		}
		return v
	}
	var exposed []string
	var labels = map[string]string{}
	for _, in := range final {
		switch in.cmd {
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		case "LABEL":
			for k, v := range parseLabels(t, in.args) {
				labels[k] = v
			}
		}
	}

	cf, err := mustBuild(t, testSpec(t)).ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if got := last("USER"); got != c.User {
		t.Errorf("Dockerfile USER %q, image %q", got, c.User)
	}
	if got, want := last("ENTRYPOINT"), jsonArray(t, c.Entrypoint); got != want {
		t.Errorf("Dockerfile ENTRYPOINT %s, image %s", got, want)
	}
	if got, want := last("CMD"), jsonArray(t, c.Cmd); got != want {
		t.Errorf("Dockerfile CMD %s, image %s", got, want)
	}
	var ports []string
	for p := range c.ExposedPorts {
		ports = append(ports, strings.TrimSuffix(p, "/tcp"))
	}
	slices.Sort(ports)
	slices.Sort(exposed)
	if !slices.Equal(exposed, ports) {
		t.Errorf("Dockerfile EXPOSE %v, image %v", exposed, ports)
	}

	// Same label names; the same values except those the build fills in.
	fromBuild := map[string]string{
		"org.opencontainers.image.version":  "${VERSION}",
		"org.opencontainers.image.revision": "${REVISION}",
		"org.opencontainers.image.created":  "${CREATED}",
	}
	var dnames, inames []string
	for k := range labels {
		dnames = append(dnames, k)
	}
	for k := range c.Labels {
		inames = append(inames, k)
	}
	slices.Sort(dnames)
	slices.Sort(inames)
	if !slices.Equal(dnames, inames) {
		t.Errorf("Dockerfile labels %v, image labels %v", dnames, inames)
	}
	for k, v := range labels {
		if want, ok := fromBuild[k]; ok {
			if v != want {
				t.Errorf("Dockerfile label %s=%q, want %q", k, v, want)
			}
			continue
		}
		if c.Labels[k] != v {
			t.Errorf("label %s: Dockerfile %q, image %q", k, v, c.Labels[k])
		}
	}
}

func jsonArray(t *testing.T, v []string) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dockerInstr is one Dockerfile instruction, continuation lines joined.
type dockerInstr struct{ cmd, args string }

// finalStage returns the instructions of the Dockerfile's last stage.
func finalStage(text string) []dockerInstr {
	var out []dockerInstr
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			out = nil
		}
		out = append(out, dockerInstr{cmd, strings.TrimSpace(args)})
	}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return out
}

// parseLabels parses LABEL's key="value" pairs (double quotes only, which
// is all the Dockerfile uses).
func parseLabels(t *testing.T, args string) map[string]string {
	t.Helper()
	out := map[string]string{}
	s := strings.TrimSpace(args)
	for s != "" {
		key, rest, ok := strings.Cut(s, "=")
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			t.Fatalf("LABEL %q: want key=\"value\" pairs", args)
		}
		if !strings.HasPrefix(rest, `"`) {
			t.Fatalf("LABEL %s: value must be double-quoted", key)
		}
		end := strings.Index(rest[1:], `"`)
		if end < 0 {
			t.Fatalf("LABEL %s: unterminated value", key)
		}
		out[key] = rest[1 : end+1]
		s = strings.TrimSpace(rest[end+2:])
	}
	return out
}

// TestShippedImage checks the archive make image wrote (PETSTORE_IMAGE):
// it loads every way TestArchiveLoads checks, keeps the runtime contract,
// is exactly what the builder makes from its own binary and labels (so two
// builds of one commit give one digest), and stays small.
func TestShippedImage(t *testing.T) {
	t.Parallel()
	path := os.Getenv("PETSTORE_IMAGE")
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PETSTORE_IMAGE is not set: make image-test tests the image make image wrote")
		}
		t.Skip("PETSTORE_IMAGE is not set: run make image-test")
	}
	dir := t.TempDir()
	untar(t, path, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index.json: %v (%v)", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref := im.Manifests[0].Annotations["io.containerd.image.name"]
	checkArchive(t, path, img, ref)

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	labels := cf.Config.Labels
	checkConfig(t, img, labels["org.opencontainers.image.version"], labels["org.opencontainers.image.revision"], cf.Created.Time)
	if !strings.HasSuffix(ref, ":"+labels["org.opencontainers.image.version"]) {
		t.Errorf("image %s is not tagged with its version %s", ref, labels["org.opencontainers.image.version"])
	}

	var binary []byte
	for _, f := range imageFiles(t, img) {
		if f.Name == binaryPath {
			binary = f.Data
		}
	}
	again, err := buildImage(buildSpec{
		Binary:   binary,
		Version:  labels["org.opencontainers.image.version"],
		Revision: labels["org.opencontainers.image.revision"],
		Created:  cf.Created.Time,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := digestOf(t, again), im.Manifests[0].Digest; got != want {
		t.Errorf("rebuilt from its own binary and labels: %s, shipped %s", got, want)
	}

	size, err := compressedSize(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s, compressed size %d bytes (%.1f MB)", path, im.Manifests[0].Digest, size, float64(size)/1e6)
	if size > 20e6 {
		t.Errorf("compressed size %d bytes: over the 20 MB budget", size)
	}
}
