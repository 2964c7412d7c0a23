package httpapi

import (
	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/memstore"
	"github.com/animal-store/petstore/ratelimit"
)

// The production types satisfy the interfaces this package consumes.
var (
	_ PetStore      = (*memstore.Store)(nil)
	_ Authenticator = (*apikey.Authenticator)(nil)
	_ Limiter       = (*ratelimit.Limiter)(nil)
	_ Throttle      = (*ratelimit.Throttle)(nil)
)
