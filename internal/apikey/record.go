package apikey

import (
	"time"

	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

// Record is a stored API key: never the secret itself, only its SHA-256.
type Record struct {
	// ID is the key's public identifier, derived from its hash (see IDFromHash).
	ID string
	// Hash is the lowercase hex SHA-256 of the full key.
	Hash string
	// Label is a free-form owner description, e.g. "acme".
	Label string
	// Plan names the key's plan.
	Plan string
	// Overrides replace the plan's window of the same period, or add one.
	Overrides []ratelimit.Window
	// Candidate windows replace the plan's candidate window of the same
	// period, or add one: proposed quotas measured on the key's traffic,
	// never enforced.
	Candidate []ratelimit.Window
	CreatedAt time.Time
	// RevokedAt is set once the key is revoked.
	RevokedAt *time.Time
}

// Revoked reports whether the key has been revoked.
func (r Record) Revoked() bool { return r.RevokedAt != nil }

// Policy returns the key's rate-limit policy under plans: its plan's
// windows and candidate windows with the key's own applied (see
// plan.Set.Policy). Every caller that holds a record goes through here, so
// none can leave out part of what the key carries.
func (r Record) Policy(plans *plan.Set) (ratelimit.Policy, error) {
	return plans.Policy(r.Plan, plan.Overrides{Quotas: r.Overrides, Candidate: r.Candidate})
}
