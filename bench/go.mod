module github.com/scheduler-dev/scheduler/bench

go 1.26.0

// The peers are measured here, in a module of their own, so that they never
// become dependencies of the scheduler. Nothing here imports the scheduler
// today (rows are exchanged as JSON with cmd/scheduler-bench, whose
// measurement code is internal); should that change, it builds against
// this checkout, never a published version.
replace github.com/scheduler-dev/scheduler => ../

require (
	github.com/bsm/redislock v0.9.4
	github.com/go-co-op/gocron/v2 v2.21.2
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
