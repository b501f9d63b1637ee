package redisnode_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// commandCalls reads how many times the server ran each of cmds (INFO
// commandstats), sub-commands included.
func commandCalls(t *testing.T, client *goredis.Client, cmds ...string) map[string]int {
	t.Helper()
	info, err := client.Info(ctxT(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for line := range strings.SplitSeq(info, "\n") {
		for _, c := range cmds {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+c+":calls="); ok {
				n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
				out[c] = n
			}
		}
	}
	return out
}

// newNamespace declares a fresh namespace new on the server behind client
// and returns a node over it.
func newNamespace(t *testing.T, client *goredis.Client) *redisnode.Node {
	t.Helper()
	p := testenv.RandomPrefix(t.Name())
	if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
		t.Fatal(err)
	}
	return redisnode.New(client, redisnode.Options{Prefix: p}, 0, 1)
}

// claimRenewRelease claims n runs of job one at a time, renews and
// releases each, and fails the test unless every step did what it should.
func claimRenewRelease(t *testing.T, node *redisnode.Node, job string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		run, token := claim.Run{Job: job, At: base.Add(time.Duration(i) * time.Minute)}, claim.NewToken()
		r, err := claimOne(t, node, run, token, "replica-a", time.Minute)
		if err != nil || r.Vote != redisnode.Granted {
			t.Fatalf("claim %d: %+v, %v", i, r, err)
		}
		cl := &claim.Claim{Run: run, Token: token, Holder: "replica-a", Fence: r.Fence, Attempt: r.Attempt}
		if _, err := node.Renew(ctxT(t), cl, time.Minute, false); err != nil {
			t.Fatalf("renew %d: %v", i, err)
		}
		if err := node.ReleaseBatch(ctxT(t), []string{run.ID()}, []string{token}, []claim.Status{claim.Succeeded})[0]; err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
		if r, err := claimOne(t, node, run, claim.NewToken(), "replica-b", time.Minute); err != nil || r.Vote != redisnode.Done {
			t.Fatalf("claim %d again: %+v, %v; want done", i, r, err)
		}
	}
}

// TestClaimsReadTheServersRunIDOncePerLibrary: on a server with Redis
// Functions, claims and renewals run as functions of the node's library,
// which reads the server's run_id (INFO server) once, not on every call;
// a library flushed away is loaded again, and reads it once more. Each
// claim reads the replication history (INFO replication, a quarter of
// INFO server's cost): a full sync replaces it without making the
// library's Lua state anew.
func TestClaimsReadTheServersRunIDOncePerLibrary(t *testing.T) {
	server := testenv.StartRedis(t)
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	node := newNamespace(t, client)
	if err := client.ConfigResetStat(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
	claimRenewRelease(t, node, "job.lib", 0, 10)
	calls := commandCalls(t, client, "info", "fcall", "evalsha")
	// 20 claims and 10 renewals as functions, the releases as scripts,
	// and one more call of each that found its program missing (a new
	// server); INFO server once, INFO replication once a claim.
	if calls["fcall"] != 31 || calls["info"] != 1+20 || calls["evalsha"] != 11 {
		t.Fatalf("after 10 claims, renewals and releases: %v; want 31 fcall, 21 info, 11 evalsha", calls)
	}
	if err := client.FunctionFlush(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
	claimRenewRelease(t, node, "job.lib", 10, 10)
	calls = commandCalls(t, client, "info", "fcall")
	// The first call after the flush found the library gone; one INFO
	// is commandCalls' own.
	if calls["fcall"] != 62 || calls["info"] != 21+1+1+20 {
		t.Fatalf("after a FUNCTION FLUSH and 10 more: %v; want 62 fcall, 43 info (one of them ours)", calls)
	}
}

// TestAServerWithoutFunctionsGetsScripts: a server that knows no FCALL
// (Redis before 7.0, or one where it is renamed away) or whose ACL
// forbids functions gets the claim and renewal as EVAL scripts, which
// read the run_id on every call, and every claim still does what it
// should.
func TestAServerWithoutFunctionsGetsScripts(t *testing.T) {
	for name, args := range map[string][]string{
		"no FCALL": {"--rename-command", "FCALL", "", "--rename-command", "FUNCTION", ""},
		"ACL":      nil,
	} {
		t.Run(name, func(t *testing.T) {
			server := testenv.StartRedis(t, args...)
			admin := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
			defer admin.Close()
			opts := &goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true}
			if name == "ACL" {
				err := admin.Do(ctxT(t), "ACL", "SETUSER", "claims", "on", ">claims", "~*", "&*", "+@all", "-fcall", "-function").Err()
				if err != nil {
					t.Fatal(err)
				}
				opts.Username, opts.Password = "claims", "claims"
			}
			client := goredis.NewClient(opts)
			defer client.Close()
			node := newNamespace(t, client)
			if err := admin.ConfigResetStat(ctxT(t)).Err(); err != nil {
				t.Fatal(err)
			}
			claimRenewRelease(t, node, "job.eval", 0, 5)
			calls := commandCalls(t, admin, "info", "evalsha", "fcall")
			// 10 claims, 5 renewals and 5 releases as scripts, each claim
			// and renewal reading the run_id.
			if calls["evalsha"] < 20 || calls["info"] < 15 || calls["fcall"] > 1 {
				t.Fatalf("after 5 claims, renewals and releases: %v; want 20 evalsha, 15 info, at most the one fcall refused", calls)
			}
		})
	}
}

// BenchmarkServerTimePerClaim measures what one claim of a fresh run
// costs the server's thread (INFO commandstats: the claim's call, as a
// function or a script), apart from the round trip and the client.
func BenchmarkServerTimePerClaim(b *testing.B) {
	server := testenv.StartRedis(b)
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := b.Context()
	p := testenv.RandomPrefix(b.Name())
	if err := redisnode.MarkNew(ctx, client, p); err != nil {
		b.Fatal(err)
	}
	node := redisnode.New(client, redisnode.Options{Prefix: p}, 0, 1)
	claimOne := func(i int) {
		run := claim.Run{Job: "job.bench", At: base.Add(time.Duration(i) * time.Minute)}
		replies, errs := node.ClaimBatch(ctx, []claim.Run{run}, []string{claim.NewToken()}, "replica-a", time.Minute)
		if errs[0] != nil || replies[0].Vote != redisnode.Granted {
			b.Fatalf("claim %d: %+v, %v", i, replies[0], errs[0])
		}
	}
	claimOne(-1) // loads the library or script
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		claimOne(i)
		i++
	}
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var usec float64
	for line := range strings.SplitSeq(info, "\n") {
		for _, c := range []string{"fcall", "evalsha"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+c+":"); ok {
				for kv := range strings.SplitSeq(rest, ",") {
					if v, ok := strings.CutPrefix(kv, "usec="); ok {
						n, _ := strconv.ParseFloat(v, 64)
						usec += n
					}
				}
			}
		}
	}
	b.ReportMetric(usec/float64(i), "server-µs/claim")
}
