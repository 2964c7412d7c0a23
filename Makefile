# petstore: `make run` starts the service on its embedded defaults,
# `make test` runs the whole suite (starting PostgreSQL and Redis if needed).

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
BIN     := bin/petstore
IMAGE   := bin/petstore-image.tar
IMAGE_REF ?= ghcr.io/animal-store/petstore:$(VERSION)
# The image's revision label and every timestamp in it: the commit's, so one
# commit gives one image digest.
REVISION          ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)

# Integration tests read their services from these; .ci/services makes sure
# they are reachable at these addresses.
export PETSTORE_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
export PETSTORE_TEST_REDIS_ADDR   ?= 127.0.0.1:6379

.PHONY: run build test test-long services vet unit system helm-test alerts-test image image-test api-test cluster cluster-down loadtest bench bench-memory fuzz mutants clean

## run: build bin/petstore and start it on embedded defaults (in-memory pets, a dev key printed at start-up)
run:
	@echo "make run: downloading the Go modules and compiling $(BIN); the first time takes a few minutes on 2 cores, later runs seconds"
	@$(GO) mod download
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/petstore
	$(BIN) serve

## build: a static, trimmed, version-stamped binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/petstore

## test: vet, unit and integration tests with the race detector, the fleet system tests, the offline chart checks,
## the alert rule tests, the image run as Kubernetes would, the API document's linters, generated client and docs page;
## the Go tests with -short, which skips the long ones (make test-long), so that it takes minutes
test: services vet unit system helm-test alerts-test image-test api-test

## test-long: what make test leaves out, which CI runs after it: every test that calls testenv.Long (the fleet's
## longest scenarios) or testenv.Cases (property tests, which -short cuts to a few cases), found in the test files and
## run in full as make test runs the rest of its package (.ci/test-long), then the mutation check of every entry
## that names its killer (make mutants runs them all)
test-long: services
	GO='$(GO)' NO_RACE_TESTS='$(NO_RACE_TESTS)' bash .ci/test-long
	MUTANTS_NAMED=1 bash .ci/mutants

services:
	@bash .ci/services

vet:
	$(GO) vet ./...
	$(GO) mod tidy -diff
	cd helm/chartest && $(GO) mod tidy -diff
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# unit's second run: the stack-depth checks, which the race detector's larger frames would defeat.
# Its third: tests whose worth is what they compute, not the concurrency under them, without the race
# detector. The decision code's property tests on miniredis drive the Lua through one client with no
# code of ours running concurrently: under the race detector they took four to five times as long (432 s
# against 81-114 s, summed over the tests), for nothing it could find. The sizing rules' statistics
# (leases and reservations under random arrivals, on the fake clock, one request at a time) took 201 s
# against 41 s; the race detector watches the same lease and reservation code in the invariant and
# fleet-of-replicas tests, which run concurrently. The cap tests on miniredis likewise (about 200 s against
# 45 s), and the lease pacing statistic (62 s against 5 s). Most tests on a real Redis stay under it: they
# wait on round trips, so it costs them little (1.0 to 1.4 times as long), and they run the limiter's
# pipelines and the requests that wait on them concurrently.
# All three runs pass -short: a property test that calls testenv.Cases runs its first cases, under the race
# detector unless listed here, and make test-long runs all of them without it (.ci/test-long): more cases
# add computation, not concurrent code the first ones did not run.
NO_RACE_TESTS = ^(TestInvariantWindowsAndRetryAfterMiniredis|TestLeasePacingAdmitsNearlyAll|TestPeriodEditKeepsCountsMiniredis|TestCandidateWindowsMiniredis|TestShortReplyTellsWhatAPeekTells|TestGiveBackKeepsEveryBucketAtLeastAdmittedMiniredis|TestGiveBackOfBlocksKeepsEveryBucketAtLeastAdmittedMiniredis|TestBlocksHoldEveryWindowMiniredis|TestPeriodEditWithBlocksKeepsCountsMiniredis|TestPeriodEditWithBlocksWhileItSpreads|TestLeaseWasteUnderRandomArrivals|TestBlockWasteUnderRandomArrivals|TestLeasesRefuseLittleBelowTheLimit|TestTransitionWindowsHoldToABlocksCap|TestTransitionWindowsHoldToALeasesCap|TestDisagreeingPlanHoldsToABlocksCap|TestLeaseEndsWithTheTransitionWindowsBucket|TestBlockEndingBeforeTheHeadKeepsItsBucketsLastEvent|TestLeaseCapRefusalWaitsUntilTheWindowFitsUnderIt|TestLeaseCapRefusalOverItsOwnLimitWaitsForTheWindow|TestBlockCapKeepsTheLaterEnd|TestBlockCapKeepsTheLaterEndOnRedis|TestNewLongWindowCountsABlockToItsEnd|TestSeedBesideALiveCoarseRecordCountsABlockToItsEnd|TestNoBlockWithoutCoarseRecords|TestPlansOfShortWindowsAloneTakeBlocks|TestCompactRecordsDecideAsFullRings)$$
unit:
	$(GO) test -short -race -count=1 -timeout 20m -skip '$(NO_RACE_TESTS)' $$($(GO) list ./... | grep -v /internal/fleettest)
	$(GO) test -short -count=1 -run 'FitsTheConnectionStack' ./internal/httpapi/
	$(GO) test -short -count=1 -timeout 10m -run '$(NO_RACE_TESTS)' ./ratelimit/

## system: the fleet on real processes (replicas, HAProxy, a private Redis) under rollouts and faults; -short
## leaves its longest scenarios (release upgrades, plan and period changes, most of the Redis faults) to make test-long.
## No race detector: the replicas are separate binaries, and it would only slow the load generator.
system:
	$(GO) test -short -count=1 -timeout 15m -v ./internal/fleettest/
	cd deploy/loadtest && $(GO) vet ./... && $(GO) test -short -race -count=1 ./...
	cd deploy/soak && $(GO) vet ./... && $(GO) test -short -race -count=1 ./...

## helm-test: the chart's checks. Without -short: the tests it would skip build the service and run it as the chart
## configures it, in about 15 s together, and only they show that what the chart renders starts.
helm-test:
	cd helm/chartest && $(GO) vet ./... && $(GO) test -count=1 -timeout 20m ./...

## alerts-test: promtool unit tests of every alerting rule (deploy/prometheus/alerts_test.yaml)
alerts-test:
	promtool check rules deploy/prometheus/alerts.yaml
	promtool test rules deploy/prometheus/alerts_test.yaml

## image: the release image as an OCI archive in bin/, built from bin/petstore without a container engine
image: build
	cd deploy/image && $(GO) run . -binary ../../$(BIN) -version "$(VERSION)" -revision "$(REVISION)" \
		-created "$(SOURCE_DATE_EPOCH)" -ref "$(IMAGE_REF)" -o ../../$(IMAGE)

## image-test: the image's tests, including running it with runc as Kubernetes would (needs root)
image-test: image
	cd deploy/image && $(GO) vet ./... && $(GO) mod tidy -diff && PETSTORE_IMAGE=$(CURDIR)/$(IMAGE) $(GO) test -count=1 -timeout 10m ./...

## api-test: the OpenAPI document through Redocly CLI and Spectral, the generated client, the docs page in Chromium.
## deploy/api follows the service's dependencies through its replace directive, so it is tidied, not checked.
api-test:
	bash deploy/api/lint
	cd deploy/api && $(GO) mod tidy && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...

## cluster: a local fleet behind HAProxy (REPLICAS=3, PROMETHEUS=1 for Prometheus, BALANCE=key for key affinity, key-bounded with bounded loads); see deploy/local
cluster: build
	@bash deploy/local/cluster.sh up

## cluster-down: stop exactly what make cluster started
cluster-down:
	@bash deploy/local/cluster.sh down

## loadtest: reset the cluster's load-test keys and run the load-test kit against it (LOADTEST_FLAGS)
loadtest:
	@bash deploy/local/cluster.sh loadtest $(LOADTEST_FLAGS)

## soak: make cluster's fleet on a private Redis at half its measured capacity over 10,000 keys for SOAK_DURATION (1h),
## the replicas rolled and Redis restarted empty every 10 minutes; fails when a replica's memory, goroutines or
## descriptors or Redis's memory or keys grow over 5%, or a request gets a 5xx outside a fault (CSV, SVG, summary in .soak/)
SOAK_DURATION ?= 1h
soak: build
	cd deploy/soak && $(GO) run . -duration $(SOAK_DURATION) -petstore $(CURDIR)/$(BIN) -dir $(CURDIR)/.soak $(SOAK_FLAGS)

## bench: the benchmarks whose figures the README quotes (installs wrk for the end-to-end one, valgrind to count Redis's instructions, lua5.1 for the decision code's line profile)
bench:
	@bash .ci/services bench
	$(GO) test -run '^$$' -bench . -skip 'RedisInstructions|LuaLineProfile|RedisMemory' -benchtime=40000x -count=1 ./ratelimit/ | tee bench.txt
	$(GO) test -run '^$$' -bench 'RedisInstructions|LuaLineProfile|RedisMemory' -benchtime=1x -count=1 ./ratelimit/ | tee -a bench.txt
	$(GO) test -c -o bin/petstore.test ./cmd/petstore/
	bin/petstore.test -test.run '^$$' -test.bench ServeWithWrk -test.benchtime 2x | tee -a bench.txt
	bin/petstore.test -test.run '^$$' -test.bench Simulate -test.benchtime 5x -test.count 3 | tee -a bench.txt
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./internal/memstore/ ./internal/apikey/ ./internal/httpapi/ | tee -a bench.txt

## bench-memory: Redis memory a key's records take (used_memory over 20,000 keys: the free plan at 1, 3, 10 and 60
## requests, three windows at 3, a million keys scaled from them) and decisions per Redis CPU second, on a private
## redis-server, in under a minute on 2 cores
bench-memory:
	$(GO) test -run '^$$' -bench RedisMemory -benchtime 1x -count 1 -v ./ratelimit/

## mutants: delete each line of the decision code that keeps a promise (ratelimit/testdata/mutants.txt), one at a
## time, and run the package's short tests against the code without it: each must fail a test (seconds a line when
## its killer is named in the list, minutes when not; MUTANTS_REDIS=1 also runs the Redis tests, on a private
## redis-server)
mutants:
	@bash .ci/mutants

## fuzz: the createPet fuzzer, the hand-written JSON encoders' fuzzers (pets, the access log line), the
## access-log scanner against encoding/json and time.Parse, the limiter's invariant tests (and the replay
## Simulator's, and the give-back's) over 2000 generated plans and the per-key override property over 200000 keys, with random seeds
fuzz: services
	$(GO) test -run '^$$' -fuzz FuzzCreatePet -fuzztime 60s ./internal/httpapi/
	$(GO) test -run '^$$' -fuzz FuzzAppendPet -fuzztime 30s ./internal/httpapi/
	$(GO) test -run '^$$' -fuzz FuzzAccessLine -fuzztime 30s ./internal/httpapi/
	$(GO) test -run '^$$' -fuzz FuzzParseLine -fuzztime 60s ./internal/accesslog/
	$(GO) test -run '^$$' -fuzz FuzzParseTime -fuzztime 30s ./internal/accesslog/
	$(GO) test -count=1 -timeout 60m -run 'Invariant|SimulatorMatches|GiveBackKeeps' ./ratelimit/ -args -invariant.cases 2000 -invariant.seed 0
	$(GO) test -count=1 -run OverrideProperty ./internal/plan/ -args -override.cases 200000 -override.seed 0

clean:
	rm -rf bin bench.txt
