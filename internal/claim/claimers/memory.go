package claimers

import (
	"context"

	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/config"
)

// memoryDriver: one process's replicas share a store; nothing survives it.
var memoryDriver = driver{
	open: func(_ context.Context, _ config.Claimer, instance string, o Options) (*Backend, error) {
		s := o.Store
		if s == nil {
			s = memory.NewStore(nil)
		}
		return &Backend{Claimer: memory.New(s, instance), Controls: s.Controls()}, nil
	},
	servers: noServers,
	dial:    noDial,
	isolate: func(context.Context, *config.Claimer, string) (func() error, error) {
		return func() error { return nil }, nil // the namespace's store is its own
	},
}
