package config

import (
	"bytes"
	"cmp"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults, beside the fields they fill (see applyDefaults).
const (
	defaultLease        = 30 * time.Second
	defaultMaxClockSkew = 2 * time.Second
	defaultPrefix       = "scheduler:"
	defaultDoneTTL      = 48 * time.Hour
	// defaultNodeTimeout: one Redis node answers in well under a millisecond
	// on a LAN; 50ms tolerates a slow one and stays far below any sane lease.
	defaultNodeTimeout   = 50 * time.Millisecond
	defaultSQLitePath    = "./scheduler.db"
	defaultHTTPAddr      = ":8080"
	defaultShutdownGrace = 30 * time.Second
	defaultMaxAttempts   = 3
	defaultMisfireGrace  = time.Hour
)

// defaultYAML is what `scheduler run` uses without --config.
//
//go:embed default.yaml
var defaultYAML []byte

// hostname is os.Hostname; tests replace it.
var hostname = os.Hostname

// Default returns the built-in configuration: the sqlite claimer on
// ./scheduler.db, HTTP on :8080 and one job, example.sleep, every 5s.
func Default() *Config {
	c, err := parse("(built-in default)", defaultYAML, func(string) (string, bool) { return "", false })
	if err != nil {
		panic("config: built-in default is invalid: " + err.Error())
	}
	return c
}

// Load reads the YAML file at path, expands ${NAME} and ${NAME:-default}
// from the environment, decodes it (unknown keys are errors), reads
// password_file secrets, applies defaults and validates it with
// Validate(nil). All problems are returned at once, joined; each is an
// *Error.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Msg: "cannot read: " + withoutPath(err).Error()}
	}
	return parse(path, data, os.LookupEnv)
}

func parse(file string, data []byte, lookup func(string) (string, bool)) (*Config, error) {
	data, errs := expand(file, data, lookup)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, syntaxError(file, err)
	}
	ix := newIndex(&root)

	c := &Config{file: file}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(c)
	var te *yaml.TypeError
	switch {
	case err == nil || errors.Is(err, io.EOF):
	case errors.As(err, &te):
		for _, msg := range te.Errors {
			errs = append(errs, ix.translate(file, msg))
		}
	default:
		return nil, syntaxError(file, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &Error{File: file, Line: extra.Line, Msg: "more than one YAML document"}
	}

	errs = append(errs, c.readSecrets()...)
	if err := c.applyDefaults(ix.present); err != nil {
		errs = append(errs, err)
	}
	// A key that failed to decode (or to default) is not reported again by
	// validation, which would see its zero value.
	failed := map[string]bool{}
	for _, err := range errs {
		if ce, ok := err.(*Error); ok && ce.Key != "" {
			failed[ce.Key] = true
		}
	}
	for _, err := range unjoin(c.Validate(nil)) {
		ce, ok := err.(*Error)
		if ok && coveredBy(ce.Key, failed) {
			continue
		}
		if ok && ce.Line == 0 {
			ce.Line = ix.lines[ce.Key]
		}
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// coveredBy reports whether key or one of its parents is in keys.
func coveredBy(key string, keys map[string]bool) bool {
	for k := key; k != ""; {
		if keys[k] {
			return true
		}
		i := strings.LastIndexAny(k, ".[")
		if i < 0 {
			return false
		}
		k = k[:i]
	}
	return false
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err != nil {
		return []error{err}
	}
	return nil
}

var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func syntaxError(file string, err error) error {
	msg := err.Error()
	if m := syntaxLine.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return &Error{File: file, Line: n, Msg: "invalid YAML: " + m[2]}
	}
	return &Error{File: file, Msg: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// readSecrets loads password_file into Password for the selected claimer,
// and rejects blocks that set a password twice. Other kinds' files are not
// read, so their secrets need not be mounted.
func (c *Config) readSecrets() []error {
	var errs []error
	read := func(key, file string, dst *Secret, inline bool, selected bool) {
		switch {
		case file == "":
		case inline:
			errs = append(errs, &Error{File: c.file, Key: key + ".password_file", Msg: "set both a password and password_file; keep one"})
		case selected:
			b, err := readSmall(file)
			s := strings.TrimRight(string(b), "\r\n")
			switch {
			case err != nil:
				errs = append(errs, &Error{File: c.file, Key: key + ".password_file", Value: file, Msg: err.Error()})
			case s == "":
				errs = append(errs, &Error{File: c.file, Key: key + ".password_file", Value: file, Msg: "empty file"})
			default:
				*dst = Secret(s)
			}
		}
	}
	cl := &c.Claimer
	read("claimer.postgres", cl.Postgres.PasswordFile, &cl.Postgres.Password, hasPassword(cl.Postgres.DSN), cl.Kind == ClaimerPostgres)
	read("claimer.redis", cl.Redis.PasswordFile, &cl.Redis.Password, cl.Redis.Password != "", cl.Kind == ClaimerRedis)
	read("claimer.redlock", cl.Redlock.PasswordFile, &cl.Redlock.Password, cl.Redlock.Password != "", cl.Kind == ClaimerRedlock)
	return errs
}

// applyDefaults fills what the file left unset. Strings use cmp.Or (empty
// means unset); numbers, durations and booleans, whose zero can be a
// deliberate choice, use present(path), which is false for absent or null
// keys.
func (c *Config) applyDefaults(present func(string) bool) error {
	var err error
	if c.InstanceID == "" {
		h, herr := hostname()
		if herr != nil || h == "" {
			err = &Error{File: c.file, Key: "instance_id", Msg: fmt.Sprintf("missing, and the host name is unavailable (%v)", herr)}
		}
		c.InstanceID = h
	}
	set := func(key string, d *Duration, def time.Duration) {
		if *d == 0 && !present(key) {
			*d = Duration(def)
		}
	}
	cl := &c.Claimer
	cl.Kind = cmp.Or(cl.Kind, ClaimerSQLite)
	set("claimer.lease", &cl.Lease, defaultLease)
	if cl.Lease > 0 {
		set("claimer.renew_every", &cl.RenewEvery, cl.Lease.Duration()/3)
	}
	set("claimer.max_clock_skew", &cl.MaxClockSkew, defaultMaxClockSkew)
	if !present("claimer.postgres.migrate") {
		cl.Postgres.Migrate = true
	}
	cl.Redis.Prefix = cmp.Or(cl.Redis.Prefix, defaultPrefix)
	set("claimer.redis.done_ttl", &cl.Redis.DoneTTL, defaultDoneTTL)
	cl.Redlock.Prefix = cmp.Or(cl.Redlock.Prefix, defaultPrefix)
	set("claimer.redlock.done_ttl", &cl.Redlock.DoneTTL, defaultDoneTTL)
	set("claimer.redlock.node_timeout", &cl.Redlock.NodeTimeout, defaultNodeTimeout)
	cl.SQLite.Path = cmp.Or(cl.SQLite.Path, defaultSQLitePath)
	cl.SQLite.Synchronous = cmp.Or(cl.SQLite.Synchronous, SyncFull)

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

	if !present("http.addr") {
		c.HTTP.Addr = defaultHTTPAddr // an explicit "" disables HTTP
	}
	c.Log.Level = cmp.Or(c.Log.Level, "info")
	c.Log.Format = cmp.Or(c.Log.Format, "text")
	set("shutdown_grace", &c.ShutdownGrace, defaultShutdownGrace)

	for name, j := range c.Jobs {
		key := "jobs." + name + "."
		j.Timezone = cmp.Or(j.Timezone, "UTC")
		j.Overlap = cmp.Or(j.Overlap, OverlapForbid)
		if j.MaxAttempts == 0 && !present(key+"max_attempts") {
			j.MaxAttempts = defaultMaxAttempts
		}
		j.Misfire.Policy = cmp.Or(j.Misfire.Policy, MisfireSkip)
		set(key+"misfire.grace", &j.Misfire.Grace, defaultMisfireGrace)
		if !present(key + "enabled") {
			j.Enabled = true
		}
		c.Jobs[name] = j
	}
	return err
}
