package redisnode

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// The claim and renew programs read the server's run_id (incarnationLua's
// server()) on every call, and INFO, which that takes, is the dearest
// command of a one-run claim: about 5 µs of the server's thread of a
// claim's 15. On a server with Redis Functions (7.0+) they run as
// functions of one library instead, where server() keeps the run_id in a
// library-level local once read. That local lives as long as the
// library's Lua state, which a restart or a FUNCTION LOAD or FLUSH
// creates anew (a replica's full sync does not), and a server keeps its
// run_id for the life of its process: so the kept value is always the one
// INFO would give. (Its replication history, which a full sync replaces,
// is read on every call: incarnationLua's lineage().) As EVAL scripts (servers without functions, or ACLs that forbid
// them), the same code reads it on every call: the local starts nil at
// each call of a script.

// A program is one of the node's Lua programs: a body run with KEYS and
// ARGV, after prelude.
type program struct {
	script *goredis.Script // prelude + body, as an EVAL script
	fn     string          // its function's name in the library
	body   string
}

// library is the claim and renew programs as one function library, named
// by a digest of its code, so that replicas of different versions (a
// rolling upgrade) each load and call their own and never replace the
// other's. Old versions' libraries stay on the server (a few KB each)
// until FUNCTION DELETE.
var library struct {
	name, code string
}

// The programs library holds; set up in init, once the bodies exist.
var claimProgram, renewProgram *program

// The programs that stay EVAL scripts: they read no run_id.
var (
	releaseProgram    = &program{script: releaseScript}
	commitProgram     = &program{script: commitScript}
	putControlProgram = &program{script: putControlScript}
	markNewProgram    = &program{script: markNewScript}
	epochProgram      = &program{script: epochScript}
	restoreProgram    = &program{script: restoreScript}
)

func init() {
	claimProgram = &program{body: claimBody}
	renewProgram = &program{body: renewBody}
	progs := []*program{claimProgram, renewProgram}
	names := []string{"claim", "renew"}
	sum := sha1.New()
	sum.Write([]byte(incarnationLua + eachLua))
	for _, p := range progs {
		sum.Write([]byte(p.body))
	}
	library.name = "scheduler_" + hex.EncodeToString(sum.Sum(nil))[:12]
	var code strings.Builder
	code.WriteString("#!lua name=" + library.name + "\n" + incarnationLua + eachLua)
	for k, p := range progs {
		p.script = goredis.NewScript(incarnationLua + eachLua + p.body)
		p.fn = library.name + "_" + names[k]
		code.WriteString("redis.register_function('" + p.fn + "', function(KEYS, ARGV)\n" + p.body + "\nend)\n")
	}
	library.code = code.String()
}

// functionMissing reports a server that has functions but not ours: it
// restarted without persistence, was flushed, or never had it.
func functionMissing(err error) bool {
	return goredis.HasErrorPrefix(err, "Function not found") // (the "ERR " is trimmed)
}

// noFunctions reports a server that will not run functions for us: one
// older than Redis 7.0 (or a proxy) that knows neither FCALL nor
// FUNCTION, or an ACL that forbids them. The node then sends EVAL
// scripts for good.
func noFunctions(err error) bool {
	var rerr goredis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := strings.TrimPrefix(rerr.Error(), "ERR ")
	return strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown subcommand") ||
		// The ACL refused FCALL or FUNCTION LOAD themselves, not a
		// command a function called ("... on @user_function").
		(strings.HasPrefix(msg, "NOPERM") && (strings.Contains(msg, "'fcall'") || strings.Contains(msg, "'function|")))
}

// functions reports whether the node calls p as a function.
func (n *Node) functions(p *program) bool { return p.fn != "" && !n.evalOnly.Load() }

// call queues (or, on a plain client, sends) one call of p.
func (n *Node) call(ctx context.Context, c goredis.Cmdable, p *program, fn bool, keys []string, args ...any) *goredis.Cmd {
	if fn {
		return c.FCall(ctx, p.fn, keys, args...)
	}
	return p.script.EvalSha(ctx, c, keys, args...)
}

// load puts what a call found missing on the server: the library (on
// every master of a cluster), or p's script. A server that refuses the
// library as such (noFunctions) moves the node to EVAL scripts, and load
// then returns nil: the call is to be made again, as a script.
func (n *Node) load(ctx context.Context, p *program, fn bool) error {
	if !fn {
		return p.script.Load(ctx, n.client).Err()
	}
	loadOne := func(ctx context.Context, c goredis.Cmdable) error {
		err := c.FunctionLoad(ctx, library.code).Err()
		if err != nil && goredis.HasErrorPrefix(err, "Library '"+library.name+"' already exists") {
			return nil // another replica loaded it first
		}
		return err
	}
	var err error
	if n.cluster != nil {
		err = n.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return loadOne(ctx, c) })
	} else {
		err = loadOne(ctx, n.client)
	}
	if err != nil && noFunctions(err) {
		n.evalOnly.Store(true)
		return nil
	}
	return err
}
