package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/httpapi"
	"github.com/animal-store/petstore/internal/postgres"
)

// databaseOutageTolerance is how long a replica whose pets live in
// PostgreSQL stays ready while the database does not answer. A blip
// shorter than this must not take every replica out of the load balancer
// at once (they all share the database); an outage longer than this is
// most likely this replica's own (its network path, its pool), and another
// replica may serve instead. README.md ("Readiness") gives the reasoning.
const databaseOutageTolerance = 30 * time.Second

// newDatabaseCheck is the readiness check of a replica that uses
// PostgreSQL, for pets or only for API keys. It reads the schema version
// the database records and compares it with the built-in migrations: a
// schema this release cannot serve makes the replica unready at once,
// whatever holds pets. Whether the database answers at all counts only
// when pets live there, and only after databaseOutageTolerance: with pets
// in memory, cached and static keys keep working through an outage.
func newDatabaseCheck(pool *pgxpool.Pool, petsInDatabase bool, log *slog.Logger, reg prometheus.Registerer) httpapi.Check {
	found := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "petstore", Name: "db_schema_version",
		Help: "Newest migration version the database records (0: none), as last read by the readiness check.",
	})
	needed := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "petstore", Name: "db_schema_version_needed",
		Help: "Newest migration version built into this release: the schema version it needs.",
	})
	reg.MustRegister(found, needed)

	// warned is the newer schema version already warned about; the checks
	// of one Readiness never run concurrently.
	var warned string
	tolerate := time.Duration(-1)
	if petsInDatabase {
		tolerate = databaseOutageTolerance
	}
	return httpapi.Check{
		Name:     "database",
		Tolerate: tolerate,
		Run: func(ctx context.Context) error {
			st, err := postgres.ReadStatus(ctx, pool)
			if err != nil {
				return err
			}
			found.Set(versionNumber(st.Version()))
			needed.Set(versionNumber(st.Needed))
			if err := st.Err(); err != nil {
				return &httpapi.NotReadyError{Err: err}
			}
			if len(st.Unknown) > 0 && st.Version() != warned {
				warned = st.Version()
				names := make([]string, len(st.Unknown))
				for i, m := range st.Unknown {
					names[i] = m.Name
				}
				log.Warn("database schema is newer than this release; serving it, as every newer migration is additive",
					slog.String("found", st.Version()), slog.String("needed", st.Needed), slog.Any("unknown_migrations", names))
			}
			return nil
		},
	}
}

// versionNumber is a migration version (NNNN) as a number; "" is 0.
func versionNumber(v string) float64 {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0
	}
	return float64(n)
}

// migrateAtStart applies the pending migrations before the replica listens
// (serve --migrate), under the same advisory lock as `petstore migrate`, so
// that replicas started together apply each migration once.
func migrateAtStart(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	applied, err := postgres.Migrate(ctx, pool)
	if err != nil {
		return fmt.Errorf("--migrate: %w", err)
	}
	if len(applied) == 0 {
		log.Info("database schema is up to date")
		return nil
	}
	log.Info("applied migrations", slog.Any("migrations", applied))
	return nil
}
