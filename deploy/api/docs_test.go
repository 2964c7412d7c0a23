package apitest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/animal-store/petstore/internal/testenv"
)

// chromiumPath finds the browser: PETSTORE_TEST_CHROMIUM, else Debian's
// chromium on PATH. Without one the test is skipped, except under CI.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PETSTORE_TEST_CHROMIUM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if testenv.InCI() {
		t.Fatal("chromium not found: CI must provide it (.ci/services installs Debian's chromium)")
	}
	t.Skip("chromium not found; install Debian's chromium or set PETSTORE_TEST_CHROMIUM to run the docs page in a browser")
	return ""
}

// pageEvents collects what the browser reports while the page loads.
type pageEvents struct {
	mu       sync.Mutex
	requests []string
	problems []string
}

func (e *pageEvents) add(list *[]string, s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	*list = append(*list, s)
}

func (e *pageEvents) snapshot() (requests, problems []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.requests...), append([]string(nil), e.problems...)
}

// TestDocsPageInBrowser loads /docs in headless Chromium: it must render
// the four operations and getPet's deprecation, log no console error or
// exception (a Content-Security-Policy violation is one), and request
// nothing from any other origin.
func TestDocsPageInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	s := startService(t)

	// The browser's profile, removed once its last process has let go
	// (t.TempDir's cleanup can race helpers still writing into it).
	profile, err := os.MkdirTemp("", "petstore-docs-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("could not remove the browser profile %s", profile)
	})

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	defer func() { _ = chromedp.Cancel(ctx) }() // close the browser before killing it
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	defer cancelTimeout()

	events := &pageEvents{}
	chromedp.ListenTarget(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			events.add(&events.requests, ev.Request.URL)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError || ev.Type == runtime.APITypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				events.add(&events.problems, "console."+string(ev.Type)+": "+strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			events.add(&events.problems, "exception: "+ev.ExceptionDetails.Error())
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.LevelError {
				events.add(&events.problems, fmt.Sprintf("log %s: %s (%s)", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
			}
		}
	})

	var text, getPet string
	var operations []*cdp.Node
	err = chromedp.Run(ctx,
		network.Enable(),
		cdplog.Enable(),
		chromedp.Navigate(s.url+"/docs"),
		// Redoc gives every operation a section named after its operationId.
		chromedp.WaitVisible(`[data-section-id="operation/getPet"]`, chromedp.ByQuery),
		chromedp.Nodes(`[data-section-id^="operation/"]`, &operations, chromedp.ByQueryAll),
		chromedp.Text(`[data-section-id="operation/getPet"]`, &getPet, chromedp.ByQuery),
		chromedp.Text(`body`, &text, chromedp.ByQuery),
		// Let late work (the search index's worker) run and report.
		chromedp.Sleep(time.Second),
	)
	requests, problems := events.snapshot()
	if err != nil {
		t.Fatalf("load %s/docs: %v\nrequests: %v\nproblems: %v", s.url, err, requests, problems)
	}
	for _, p := range problems {
		t.Errorf("browser reported %s", p)
	}
	for _, u := range requests {
		if !strings.HasPrefix(u, s.url+"/") && !strings.HasPrefix(u, "data:") && !strings.HasPrefix(u, "blob:"+s.url+"/") {
			t.Errorf("page requested %s, outside %s", u, s.url)
		}
	}
	for _, want := range []string{s.url + "/docs", s.url + "/docs/redoc.standalone.js", s.url + "/openapi.json"} {
		if !contains(requests, want) {
			t.Errorf("page did not request %s: %v", want, requests)
		}
	}

	ids := map[string]bool{}
	for _, n := range operations {
		ids[strings.TrimPrefix(n.AttributeValue("data-section-id"), "operation/")] = true
	}
	for _, op := range []string{"listPets", "createPet", "getPet", "getRateLimit"} {
		if !ids[op] {
			t.Errorf("operation %s not shown (sections: %v)", op, ids)
		}
	}
	for _, want := range []string{"List pets", "Add a pet", "Get a pet (deprecated)", "/pets/{petId}", "Get the key's rate limits", "/rate_limit"} {
		if !strings.Contains(text, want) {
			t.Errorf("page does not show %q", want)
		}
	}
	if !strings.Contains(strings.ToLower(getPet), "deprecated") || !strings.Contains(getPet, "5 December 2030") {
		t.Errorf("getPet's section does not show its deprecation:\n%.600s", getPet)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
