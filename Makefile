# petstore: `make run` starts the service on its embedded defaults,
# `make test` runs the whole suite (starting PostgreSQL and Redis if needed).

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
BIN     := bin/petstore

# Integration tests read their services from these; .ci/services makes sure
# they are reachable at these addresses.
export PETSTORE_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
export PETSTORE_TEST_REDIS_ADDR   ?= 127.0.0.1:6379

.PHONY: run build test services vet unit helm-test bench fuzz clean

## run: start the service on embedded defaults (in-memory pets, a dev key printed at start-up)
run:
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/petstore serve

## build: a static, trimmed, version-stamped binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/petstore

## test: vet, unit and integration tests with the race detector, and the offline chart checks
test: services vet unit helm-test

services:
	@bash .ci/services

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

unit:
	$(GO) test -race -count=1 -timeout 20m ./...

helm-test:
	cd helm/chartest && $(GO) vet ./... && $(GO) test -count=1 -timeout 20m ./...

## bench: the benchmarks whose figures the README quotes
bench: services
	$(GO) test -run '^$$' -bench . -benchtime=40000x -count=1 ./ratelimit/ | tee bench.txt
	$(GO) test -c -o bin/petstore.test ./cmd/petstore/
	for i in 1 2 3 4 5 6; do bin/petstore.test -test.run '^$$' -test.bench ListPetsEndToEnd -test.benchtime 3s; done | tee -a bench.txt
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./internal/memstore/ ./internal/apikey/ ./internal/httpapi/ | tee -a bench.txt

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzCreatePet -fuzztime 60s ./internal/httpapi/

clean:
	rm -rf bin bench.txt
