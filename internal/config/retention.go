package config

import (
	"cmp"
	"fmt"
	"time"
)

// ClaimWindow is the one statement of how long a replica may still bid for
// a run after the run ended, measured on the backend's clock from its
// terminal release (prune's finished_at; a Redis done marker's TTL restarts
// there). Every retention of finished runs, `scheduler prune --older-than`
// and claimer.redis/redlock.done_ttl, must be at least this long for every
// job: a run forgotten earlier would be granted again as attempt 1 and
// could execute twice. Interrupted and live runs are never forgotten, so
// takeovers (max_attempts) only ever meet a terminal run after its release.
//
// The window is max(grace, late) + 2×skew + 2×lease, where late is the
// runner's late tolerance, 2×skew + 5s:
//
//   - max(grace, late): how far past an instant, on its own clock, a
//     replica still bids for it and may execute it: on time up to the late
//     tolerance, a run-once misfire up to grace, the start-up lookback up
//     to the larger of both. (A loop that wakes later still claims the
//     latest missed instant, but only to record it skipped.)
//   - 2×skew: that replica's clock may run max_clock_skew behind the
//     backend's, and the run may have finished max_clock_skew before its
//     instant, won by a replica whose clock runs ahead.
//   - 2×lease: a bid dispatched inside the window still waits out its
//     spread hold and a claim call (at most a third of the lease each), and
//     a standby that watched the run held bids again within 1.2×renew_every
//     plus a claim call after the release.
//
// Zero grace or skew count as the runner's defaults (1h, 2s), because the
// runner substitutes them. A future backfill must widen this function, not
// add a bound of its own.
func ClaimWindow(grace, lease, skew time.Duration) time.Duration {
	grace = cmp.Or(grace, jobDefaults.Misfire.Grace.Duration())
	skew = cmp.Or(skew, defaults.Claimer.MaxClockSkew.Duration())
	return max(grace, lateTolerance(skew)) + 2*skew + 2*lease
}

// lateTolerance mirrors the runner's: how late on its own clock a replica
// still dispatches a run as on time.
func lateTolerance(skew time.Duration) time.Duration { return 2*skew + 5*time.Second }

// MinRetention is the shortest safe retention of finished runs for c: the
// longest ClaimWindow of its jobs (enabled or not: a job enabled again
// looks back over its grace), and the job that needs it. With no jobs it
// is the window of a job with default options, and job is "".
func (c *Config) MinRetention() (d time.Duration, job string) {
	lease, skew := c.Claimer.Lease.Duration(), c.Claimer.MaxClockSkew.Duration()
	if len(c.Jobs) == 0 {
		return ClaimWindow(0, lease, skew), ""
	}
	for _, name := range c.JobNames() {
		if w := ClaimWindow(c.Jobs[name].Misfire.Grace.Duration(), lease, skew); job == "" || w > d {
			d, job = w, name
		}
	}
	return d, job
}

// CheckRetention returns nil if finished runs may be forgotten d after
// they ended, else an error saying how long is needed, which job needs it
// and why. Callers prefix the setting and its value.
func (c *Config) CheckRetention(d time.Duration) error {
	need, job := c.MinRetention()
	if d >= need {
		return nil
	}
	who := "a job with default options"
	if job != "" {
		who = "jobs." + job
	}
	grace := cmp.Or(c.Jobs[job].Misfire.Grace.Duration(), jobDefaults.Misfire.Grace.Duration())
	skew := cmp.Or(c.Claimer.MaxClockSkew.Duration(), defaults.Claimer.MaxClockSkew.Duration())
	return fmt.Errorf("must be at least %v, the longest a replica may still claim a finished run of %s: "+
		"max(misfire.grace %v, late tolerance %v) + 2×max_clock_skew %v + 2×lease %v",
		need, who, grace, lateTolerance(skew), skew, c.Claimer.Lease)
}
