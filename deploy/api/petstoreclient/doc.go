// Package petstoreclient is a Go client of the Animal Store API generated
// by oapi-codegen (pinned by the tool directive in ../go.mod) from the
// document the service serves, internal/httpapi/openapi.yaml. Regenerate it
// with `go generate ./...` in deploy/api; a test fails while it is stale.
//
// Point it at the base URL, version segment included:
//
//	c, err := petstoreclient.NewClientWithResponses("https://petstore.example/v1",
//		petstoreclient.WithRequestEditorFn(bearer(key)))
package petstoreclient

//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../../../internal/httpapi/openapi.yaml
