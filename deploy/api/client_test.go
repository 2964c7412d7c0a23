package apitest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/animal-store/petstore/deploy/api/petstoreclient"
	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/httpapi"
	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

// service is the real public router on a loopback port, with the
// in-memory store, static keys and in-process rate limits.
type service struct {
	url string
	// key has a roomy quota; tightKey may make 3 requests a minute.
	key, tightKey string
}

func startService(t *testing.T) service {
	t.Helper()
	key, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tightKey, err := apikey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	plans := plan.Defaults()
	keys, err := apikey.ParseKeys(fmt.Appendf(nil, `keys:
  - {key: %s, plan: pro, label: client test}
  - {key: %s, plan: free, label: client test, quotas: [{limit: 3, period: 1m}]}
`, key, tightKey), plans)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := apikey.NewAuthenticator(apikey.Options{Plans: plans, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	limiter, err := ratelimit.New(nil, ratelimit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { limiter.Close() })
	throttle, err := ratelimit.NewThrottle(nil, ratelimit.ThrottleLimit{Rate: 100, Burst: 100, Period: time.Minute}, ratelimit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { throttle.Close() })
	usageThrottle, err := ratelimit.NewNamedThrottle(nil, "rate_limit", httpapi.UsageThrottleLimit(), ratelimit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { usageThrottle.Close() })
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Config{
		Store: memstore.New(), Auth: auth, Limiter: limiter, Throttle: throttle,
		Usage: limiter, UsageThrottle: usageThrottle,
	}))
	t.Cleanup(srv.Close)
	return service{url: srv.URL, key: key, tightKey: tightKey}
}

// client is the generated client on the base URL the specification gives:
// the host with the version segment.
func (s service) client(t *testing.T, key string) *petstoreclient.ClientWithResponses {
	t.Helper()
	var opts []petstoreclient.ClientOption
	if key != "" {
		opts = append(opts, petstoreclient.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+key)
			return nil
		}))
	}
	c, err := petstoreclient.NewClientWithResponses(s.url+"/v1", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var nextCursor = regexp.MustCompile(`^<(/v1/pets\?[^>]*)>; rel="next"$`)

func TestGeneratedClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := startService(t)
	c := s.client(t, s.key)

	// create, once with an Idempotency-Key retried
	sold := petstoreclient.Sold
	want := []petstoreclient.NewPet{
		{Name: "Rex", CategoryId: 1},
		{Name: "Tom", CategoryId: 2, Status: &sold},
		{Name: "Nala", CategoryId: 1},
	}
	var created []petstoreclient.Pet
	for i, np := range want {
		idem := fmt.Sprintf("create-%d", i)
		resp, err := c.CreatePetWithResponse(ctx, &petstoreclient.CreatePetParams{IdempotencyKey: &idem}, np)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != http.StatusCreated || resp.JSON201 == nil {
			t.Fatalf("create %s: %d %s", np.Name, resp.StatusCode(), resp.Body)
		}
		p := *resp.JSON201
		if p.Name != np.Name || p.CategoryId != np.CategoryId || (np.Status == nil && p.Status != petstoreclient.Available) {
			t.Errorf("created %+v from %+v", p, np)
		}
		if loc := resp.HTTPResponse.Header.Get("Location"); loc != fmt.Sprintf("/v1/pets/%d", p.Id) {
			t.Errorf("Location %q for pet %d", loc, p.Id)
		}
		created = append(created, p)
	}
	again, err := c.CreatePetWithResponse(ctx, &petstoreclient.CreatePetParams{IdempotencyKey: ptr("create-0")}, want[0])
	if err != nil {
		t.Fatal(err)
	}
	if again.StatusCode() != http.StatusCreated || again.JSON201.Id != created[0].Id || again.HTTPResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retried create: %d %s", again.StatusCode(), again.Body)
	}
	bad, err := c.CreatePetWithResponse(ctx, nil, petstoreclient.NewPet{Name: "\u200b", CategoryId: 1})
	if err != nil {
		t.Fatal(err)
	}
	if bad.StatusCode() != http.StatusBadRequest || bad.JSON400 == nil || bad.JSON400.Code != petstoreclient.ErrorCodeInvalidRequest {
		t.Errorf("invisible name: %d %s", bad.StatusCode(), bad.Body)
	}

	// list with paging: follow the cursor of Link rel="next" to the end
	var listed []petstoreclient.Pet
	params := &petstoreclient.ListPetsParams{Limit: ptr(2)}
	for page := 1; ; page++ {
		resp, err := c.ListPetsWithResponse(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != http.StatusOK || resp.JSON200 == nil {
			t.Fatalf("page %d: %d %s", page, resp.StatusCode(), resp.Body)
		}
		if h := resp.HTTPResponse.Header; h.Get("X-RateLimit-Limit") != "300" || h.Get("X-RateLimit-Remaining") == "" {
			t.Errorf("page %d: rate-limit headers %v", page, h)
		}
		listed = append(listed, *resp.JSON200...)
		link := resp.HTTPResponse.Header.Get("Link")
		if link == "" {
			break
		}
		m := nextCursor.FindStringSubmatch(link)
		if m == nil || page > len(want) {
			t.Fatalf("page %d: Link %q", page, link)
		}
		next, err := url.Parse(m[1])
		if err != nil {
			t.Fatal(err)
		}
		params = &petstoreclient.ListPetsParams{Limit: ptr(2), Cursor: ptr(next.Query().Get("cursor"))}
	}
	if fmt.Sprint(listed) != fmt.Sprint(created) {
		t.Errorf("listed %+v, created %+v", listed, created)
	}
	soldOnly, err := c.ListPetsWithResponse(ctx, &petstoreclient.ListPetsParams{Status: &sold})
	if err != nil {
		t.Fatal(err)
	}
	if soldOnly.JSON200 == nil || len(*soldOnly.JSON200) != 1 || (*soldOnly.JSON200)[0].Name != "Tom" {
		t.Errorf("status=sold: %d %s", soldOnly.StatusCode(), soldOnly.Body)
	}

	// get, deprecated
	got, err := c.GetPetWithResponse(ctx, created[1].Id)
	if err != nil {
		t.Fatal(err)
	}
	if got.StatusCode() != http.StatusOK || got.JSON200 == nil || *got.JSON200 != created[1] {
		t.Fatalf("get %d: %d %s", created[1].Id, got.StatusCode(), got.Body)
	}
	if h := got.HTTPResponse.Header; h.Get("Deprecation") != "@1767225600" || h.Get("Sunset") == "" {
		t.Errorf("getPet without deprecation headers: %v", h)
	}

	// 404
	missing, err := c.GetPetWithResponse(ctx, 9_999)
	if err != nil {
		t.Fatal(err)
	}
	if missing.StatusCode() != http.StatusNotFound || missing.JSON404 == nil || missing.JSON404.Code != petstoreclient.ErrorCodeNotFound || missing.JSON404.Status != 404 {
		t.Errorf("unknown pet: %d %s", missing.StatusCode(), missing.Body)
	}
}

func TestGeneratedClientUnauthorized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := startService(t)
	for name, c := range map[string]*petstoreclient.ClientWithResponses{
		"no key":      s.client(t, ""),
		"unknown key": s.client(t, "pst_0000000000000000000000000000000000000"),
	} {
		resp, err := c.ListPetsWithResponse(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != http.StatusUnauthorized || resp.JSON401 == nil || resp.JSON401.Code != petstoreclient.ErrorCodeUnauthorized {
			t.Errorf("%s: %d %s", name, resp.StatusCode(), resp.Body)
		}
		if got := resp.HTTPResponse.Header.Get("WWW-Authenticate"); got == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", name)
		}
	}
}

func TestGeneratedClientRateLimited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := startService(t)
	c := s.client(t, s.tightKey)
	for i := 1; i <= 3; i++ {
		resp, err := c.ListPetsWithResponse(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != http.StatusOK {
			t.Fatalf("request %d of 3 allowed: %d %s", i, resp.StatusCode(), resp.Body)
		}
	}
	resp, err := c.ListPetsWithResponse(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != http.StatusTooManyRequests || resp.JSON429 == nil || resp.JSON429.Code != petstoreclient.ErrorCodeRateLimited || resp.JSON429.Status != 429 {
		t.Fatalf("request 4 of 3: %d %s", resp.StatusCode(), resp.Body)
	}
	if h := resp.HTTPResponse.Header; h.Get("Retry-After") == "" || h.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("429 headers: %v", h)
	}
}

// TestGeneratedClientReadsRateLimit: the key's quota, read without
// spending it, then the operation's own throttle and a 401.
func TestGeneratedClientReadsRateLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := startService(t)
	c := s.client(t, s.tightKey)
	for i := 1; i <= 2; i++ {
		if resp, err := c.ListPetsWithResponse(ctx, nil); err != nil || resp.StatusCode() != http.StatusOK {
			t.Fatalf("request %d: %v %v", i, resp, err)
		}
	}
	// The tight key is on free (60/1m, 1000/24h) with a quota of its own,
	// 3/1m, in place of the plan's minute. Asking ten times (the
	// throttle's burst) spends none of it.
	for i := 1; i <= 10; i++ {
		resp, err := c.GetRateLimitWithResponse(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != http.StatusOK || resp.JSON200 == nil {
			t.Fatalf("ask %d: %d %s", i, resp.StatusCode(), resp.Body)
		}
		q := *resp.JSON200
		w := q.Windows
		if q.Plan != "free" || q.Mode != petstoreclient.Enforce || len(w) != 2 ||
			w[0].Period != "1m" || w[0].Limit != 3 || w[0].Used != 2 || w[0].Remaining != 1 ||
			w[1].Period != "24h" || w[1].Limit != 1000 || w[1].Used != 2 || w[1].Remaining != 998 ||
			q.Ban.Banned || q.Ban.Until != nil {
			t.Fatalf("ask %d: %s", i, resp.Body)
		}
		if h := resp.HTTPResponse.Header; h.Get("X-RateLimit-Limit") != "3" || h.Get("X-RateLimit-Remaining") != "1" {
			t.Errorf("ask %d: rate-limit fields %v", i, h)
		}
	}
	if resp, err := c.ListPetsWithResponse(ctx, nil); err != nil || resp.StatusCode() != http.StatusOK || resp.HTTPResponse.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("third request after ten asks: %v %v", resp.HTTPResponse.Header, err)
	}
	over, err := c.GetRateLimitWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if over.StatusCode() != http.StatusTooManyRequests || over.JSON429 == nil || over.JSON429.Code != petstoreclient.ErrorCodeRateLimited || over.HTTPResponse.Header.Get("Retry-After") == "" {
		t.Fatalf("ask 11 of a burst of 10: %d %s", over.StatusCode(), over.Body)
	}
	anon, err := s.client(t, "").GetRateLimitWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if anon.StatusCode() != http.StatusUnauthorized || anon.JSON401 == nil || anon.JSON401.Code != petstoreclient.ErrorCodeUnauthorized {
		t.Fatalf("no key: %d %s", anon.StatusCode(), anon.Body)
	}
}

// TestBaseURLCarriesTheVersion: a client given the host alone, as the
// document once required, no longer reaches the operations.
func TestBaseURLCarriesTheVersion(t *testing.T) {
	t.Parallel()
	s := startService(t)
	c, err := petstoreclient.NewClientWithResponses(s.url, petstoreclient.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+s.key)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.ListPetsWithResponse(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.HTTPResponse.Request.URL.Path != "/pets" || resp.StatusCode() != http.StatusNotFound {
		t.Errorf("GET %s: %d", resp.HTTPResponse.Request.URL.Path, resp.StatusCode())
	}
}

func ptr[T any](v T) *T { return &v }
