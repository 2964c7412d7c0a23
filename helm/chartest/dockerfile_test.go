package chartest

import (
	"regexp"
	"strings"
	"testing"
)

// dockerInstr is one Dockerfile instruction with its continuation lines
// joined.
type dockerInstr struct {
	Cmd  string // upper case
	Args string
}

func parseDockerfile(text string) []dockerInstr {
	var out []dockerInstr
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		out = append(out, dockerInstr{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)})
	}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return out
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	instrs := parseDockerfile(string(readFile(t, deployDir+"/Dockerfile")))
	var froms []string
	var final []dockerInstr // instructions of the last stage
	for _, in := range instrs {
		if in.Cmd == "FROM" {
			froms = append(froms, in.Args)
			final = nil
		}
		final = append(final, in)
	}
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, got %d FROM", len(froms))
	}
	base := strings.Fields(froms[len(froms)-1])[0]
	if !strings.HasPrefix(base, "gcr.io/distroless/static") && base != "scratch" {
		t.Errorf("final stage must be distroless static or scratch, got %s", base)
	}
	if !strings.HasPrefix(froms[0], "golang:") {
		t.Errorf("build stage must use the golang image, got %s", froms[0])
	}

	var build string
	for _, in := range instrs {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "go build") {
			build = in.Args
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.version=${VERSION}", "./cmd/petstore"} {
		if !strings.Contains(build, want) {
			t.Errorf("go build must use %s: %s", want, build)
		}
	}

	last := map[string][]string{}
	for _, in := range final {
		last[in.Cmd] = append(last[in.Cmd], in.Args)
	}
	user := last["USER"]
	if len(user) == 0 || !regexp.MustCompile(`^65532(:65532)?$`).MatchString(user[len(user)-1]) {
		t.Errorf("final stage must run as USER 65532:65532, got %v", user)
	}
	if got := strings.Join(last["EXPOSE"], " "); !strings.Contains(got, "8080") || !strings.Contains(got, "9090") {
		t.Errorf("EXPOSE must list 8080 and 9090, got %q", got)
	}
	if got := last["ENTRYPOINT"]; len(got) != 1 || got[0] != `["/petstore"]` {
		t.Errorf(`ENTRYPOINT must be ["/petstore"], got %v`, got)
	}
	if got := last["CMD"]; len(got) != 1 || got[0] != `["serve"]` {
		t.Errorf(`CMD must be ["serve"], got %v`, got)
	}
	if !strings.Contains(strings.Join(last["ARG"], " "), "VERSION") {
		t.Error("final stage must declare ARG VERSION for its labels")
	}
	labels := strings.Join(last["LABEL"], " ")
	for _, want := range []string{"org.opencontainers.image.source", "org.opencontainers.image.version", "org.opencontainers.image.revision", "org.opencontainers.image.title"} {
		if !strings.Contains(labels, want) {
			t.Errorf("missing OCI label %s", want)
		}
	}
	for _, in := range final {
		if in.Cmd == "RUN" {
			t.Errorf("final stage has no shell: RUN %s cannot work", in.Args)
		}
	}
}
