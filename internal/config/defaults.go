package config

import (
	"cmp"
	"os"
	"strconv"
	"time"
)

// defaults is the one table of defaults: Load decodes the file onto a copy
// of it (see decoder for what counts as unset). jobDefaults is the same for
// each job. Settings whose default depends on others are derived by
// deriveDefaults. Keep both free of maps and slices, which a copy would
// share.
var (
	defaults = Config{
		Claimer: Claimer{
			Kind:         ClaimerSQLite,
			Lease:        Duration(30 * time.Second),
			MaxClockSkew: Duration(2 * time.Second),
			Postgres:     Postgres{Migrate: true},
			Redis:        Redis{Prefix: "scheduler:", DoneTTL: Duration(48 * time.Hour)},
			Redlock: Redlock{
				Prefix:  "scheduler:",
				DoneTTL: Duration(48 * time.Hour),
				// One Redis node answers in well under a millisecond on a
				// LAN; 50ms tolerates a slow one and stays far below any
				// sane lease.
				NodeTimeout: Duration(50 * time.Millisecond),
			},
			Etcd:   Etcd{Prefix: "scheduler/", DoneTTL: Duration(48 * time.Hour), DialTimeout: Duration(5 * time.Second)},
			SQLite: SQLite{Path: "./scheduler.db", Synchronous: SyncFull},
		},
		HTTP:          HTTP{Addr: ":8080"},
		Log:           Log{Level: "info", Format: "text"},
		ShutdownGrace: Duration(30 * time.Second),
	}
	jobDefaults = Job{
		Timezone:    "UTC",
		Overlap:     OverlapForbid,
		MaxAttempts: 3,
		Misfire:     Misfire{Policy: MisfireSkip, Grace: Duration(time.Hour), MaxCatchup: 10},
		Enabled:     true,
	}
)

// hostname is os.Hostname; tests replace it.
var hostname = os.Hostname

// deriveDefaults fills the settings whose default depends on other
// settings. given reports whether the file set a key to a non-null value.
func (c *Config) deriveDefaults(p *problems, given func(key string) bool) {
	if c.InstanceID == "" {
		h, err := hostname()
		if err != nil || h == "" {
			p.add("instance_id", "", "missing, and the host name is unavailable (%v)", err)
		}
		c.InstanceID = h
	}
	cl := &c.Claimer
	if cl.Lease > 0 && !given("claimer.renew_every") {
		cl.RenewEvery = cl.Lease / 3
	}

	for name, j := range c.Jobs {
		if !j.Retry.Enabled() {
			continue
		}
		key := "jobs." + name
		if j.Retry.MaxAttempts > 0 {
			if given(key+".max_attempts") && j.MaxAttempts != j.Retry.MaxAttempts {
				p.add(key+".retry.max_attempts", strconv.Itoa(j.Retry.MaxAttempts),
					"conflicts with %s.max_attempts %d: both bound the same count; set one", key, j.MaxAttempts)
			}
			j.MaxAttempts = j.Retry.MaxAttempts
		}
		j.Retry.MaxAttempts = j.MaxAttempts
		if !given(key + ".retry.backoff") {
			j.Retry.Backoff = Duration(10 * time.Second)
		}
		if !given(key + ".retry.max_backoff") {
			j.Retry.MaxBackoff = max(Duration(10*time.Minute), j.Retry.Backoff)
		}
		c.Jobs[name] = j
	}

	d := &c.Database
	if d.Kind == "" {
		switch {
		case d.DSN != "" || d.Path == "" && cl.Kind == ClaimerPostgres:
			d.Kind = DatabasePostgres
		default:
			d.Kind = DatabaseSQLite
		}
	}
	if d.Kind == DatabasePostgres && d.DSN == "" && cl.Kind == ClaimerPostgres {
		d.DSN, d.Password = cl.Postgres.DSN, cl.Postgres.Password
	}
	if d.Kind == DatabaseSQLite {
		d.Path = cmp.Or(d.Path, cl.SQLite.Path)
	}
}
