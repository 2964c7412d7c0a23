// Package chartest validates the petstore deployment artifacts offline: the
// Helm chart in helm/petstore (lint, render, strict decoding into the
// Kubernetes API types, hardening and wiring checks), the kustomize overlays
// in deploy/kustomize (and their drift from the chart), the Grafana
// dashboard and Prometheus alerts (every metric they use is one the service
// exports) and the Dockerfile.
//
// It is a module of its own so that the service's go.mod does not carry the
// Helm, Kubernetes and kustomize dependency trees. Everything lives in tests:
//
//	cd helm/chartest && go test ./...
package chartest
