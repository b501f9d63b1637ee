package config

import (
	"bytes"
	_ "embed"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// defaultYAML is what `scheduler run` uses without --config.
//
//go:embed default.yaml
var defaultYAML []byte

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
func Load(path string) (*Config, error) { return LoadFor(path, nil) }

// LoadFor is Load, validating against the job names registered reports
// true for (Validate(registered)): a job without a handler is reported
// with the file's other problems and its line, not after they are fixed.
// So are the problems of each check (the binary's handlers' checks of
// their params, which this package cannot see): an *Error among them is
// given its key's line.
func LoadFor(path string, registered func(job string) bool, checks ...func(*Config) error) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Msg: "cannot read: " + withoutPath(err).Error()}
	}
	return parseFor(path, data, os.LookupEnv, registered, checks...)
}

func parse(file string, data []byte, lookup func(string) (string, bool)) (*Config, error) {
	return parseFor(file, data, lookup, nil)
}

func parseFor(file string, data []byte, lookup func(string) (string, bool), registered func(string) bool, checks ...func(*Config) error) (*Config, error) {
	data, errs := expand(file, data, lookup)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root, extra yaml.Node
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(file, err)
	}
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &Error{File: file, Line: extra.Line, Msg: "more than one YAML document"}
	}
	if len(root.Content) == 0 || root.Content[0].Tag == "!!null" {
		// A file truncated or left empty (a ConfigMap mounted before it
		// was written) would start a replica that runs nothing, on the
		// defaults, and says so only as "0 jobs" (outside review).
		return nil, &Error{File: file, Msg: "is empty: a replica's config names at least its jobs (see config.example.yaml)"}
	}

	c := new(Config)
	*c = defaults
	c.file = file
	p := &problems{file: file}
	d := &decoder{problems: p, lines: map[string]int{}}
	if len(root.Content) == 1 {
		d.decode("", root.Content[0], reflect.ValueOf(c).Elem())
	}
	c.readSecrets(p)
	c.deriveDefaults(p, func(key string) bool { _, ok := d.lines[key]; return ok })

	// A key that failed to decode (or to default) is not reported again by
	// validation, which would see its default or zero value.
	failed := map[string]bool{}
	for _, err := range p.errs {
		failed[err.(*Error).Key] = true
	}
	found := unjoin(c.Validate(registered))
	for _, check := range checks {
		found = append(found, unjoin(check(c))...)
	}
	for _, err := range found {
		ce, ok := err.(*Error)
		if ok && coveredBy(ce.Key, failed) {
			continue
		}
		if ok && ce.Line == 0 {
			ce.Line = d.lines[ce.Key]
		}
		p.errs = append(p.errs, err)
	}
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
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

// syntaxError reports a document yaml cannot parse. yaml gives no position
// but in its message text ("yaml: line 3: …"), which is shown as it is
// rather than parsed.
func syntaxError(file string, err error) error {
	return &Error{File: file, Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
}

// readSecrets loads password_file into Password for the selected claimer,
// and rejects blocks that set a password twice. Other kinds' files are not
// read, so their secrets need not be mounted.
func (c *Config) readSecrets(p *problems) {
	read := func(key, file string, dst *Secret, inline bool, selected bool) {
		if !strings.HasSuffix(key, "_file") {
			key += ".password_file"
		}
		switch {
		case file == "":
		case inline:
			p.add(key, "", "set both the secret and %s; keep one", key[strings.LastIndexByte(key, '.')+1:])
		case selected:
			s, err := readSecret(file)
			if err != nil {
				p.add(key, file, "%v", err)
			} else {
				*dst = s
			}
		}
	}
	cl := &c.Claimer
	read("claimer.postgres", cl.Postgres.PasswordFile, &cl.Postgres.Password, hasPassword(cl.Postgres.DSN), cl.Kind == ClaimerPostgres)
	read("claimer.redis", cl.Redis.PasswordFile, &cl.Redis.Password, cl.Redis.Password != "", cl.Kind == ClaimerRedis)
	read("claimer.redlock", cl.Redlock.PasswordFile, &cl.Redlock.Password, cl.Redlock.Password != "", cl.Kind == ClaimerRedlock)
	read("claimer.etcd", cl.Etcd.PasswordFile, &cl.Etcd.Password, cl.Etcd.Password != "", cl.Kind == ClaimerEtcd)
	read("http.token_file", c.HTTP.TokenFile, &c.HTTP.Token, c.HTTP.Token != "", true)
}
