// Package apitest checks the API contract as its users' tooling meets it,
// against the real router (httpapi.NewServer with the in-memory store):
//
//   - a Go client generated with oapi-codegen (package petstoreclient)
//     creates, lists page by page, gets, reads the key's rate limits, and
//     meets 404, 401 and 429;
//   - that client is what oapi-codegen makes of the document the service
//     serves today;
//   - the docs page loads in headless Chromium with no console error and no
//     request to another host, and shows every operation.
//
// It is a module of its own so that the generator, its runtime and the
// browser driver stay out of the service's go.mod. The linters of the
// document (Redocly CLI, Spectral) are pinned in package.json beside it.
package apitest
