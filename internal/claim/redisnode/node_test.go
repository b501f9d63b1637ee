package redisnode_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.IgnoreRedisDialProbe) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var base = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// isolated returns a client of the test server and a key prefix whose keys
// are deleted when tb ends.
func isolated(tb testing.TB) (*goredis.Client, string) {
	addr := testenv.RedisAddr(tb)
	client := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = client.Close() })
	return client, testenv.RedisPrefix(tb, addr)
}

func TestHeldReplyIdentifiesTheGrant(t *testing.T) {
	client, p := isolated(t)
	if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
		t.Fatal(err)
	}
	node := redisnode.New(client, redisnode.Options{Prefix: p}, 0, 1)
	run := claim.Run{Job: "job.key", At: base}
	first := claim.NewToken()
	if r, err := claimOne(t, node, run, first, "replica-a", time.Minute); err != nil || r.Vote != redisnode.Granted {
		t.Fatalf("first claim: %+v, %v", r, err)
	}
	r, err := claimOne(t, node, run, claim.NewToken(), "replica-b", time.Minute)
	if err != nil || r.Vote != redisnode.Held || r.Holder != "replica-a" || r.HolderKey != redisnode.TokenKey(first) {
		t.Fatalf("second claim: %+v, %v; want held by replica-a with key %s", r, err, redisnode.TokenKey(first))
	}
	// A retried request (same token) is granted again, not held by itself.
	if r, err := claimOne(t, node, run, first, "replica-a", time.Minute); err != nil || r.Vote != redisnode.Granted || r.Attempt != 1 {
		t.Fatalf("retried claim: %+v, %v; want the same grant", r, err)
	}
}

// TestALaterTryOfABidIsGrantedWhatAnEarlierTryLeft: a claim's reply and
// its undo were lost (a stalled server); the same replica's next try of
// the bid is granted that grant, with its attempt, a lease from now and
// a fence above every grant of the job before the try (another grant of
// the job came in between here), and the earlier try's token no longer
// holds it: its undo or
// renewal, landing late, changes nothing, and the earlier try itself,
// landing late, takes nothing back. Another bid, even the same holder's,
// is held off.
func TestALaterTryOfABidIsGrantedWhatAnEarlierTryLeft(t *testing.T) {
	client, p := isolated(t)
	if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
		t.Fatal(err)
	}
	node := redisnode.New(client, redisnode.Options{Prefix: p}, 0, 1)
	run := claim.Run{Job: "job.bid", At: base}
	var bids claim.Bids
	try1 := bids.Token(run)
	first, err := claimOne(t, node, run, try1, "replica-a", time.Minute)
	if err != nil || first.Vote != redisnode.Granted {
		t.Fatalf("first try: %+v, %v", first, err)
	}
	bids.Open(run, try1, time.Now().Add(time.Minute))
	// A later instant of the job is granted, and heard of, before the
	// next try leaves.
	between, err := claimOne(t, node, claim.Run{Job: "job.bid", At: base.Add(time.Minute)}, claim.NewToken(), "replica-b", time.Minute)
	if err != nil || between.Vote != redisnode.Granted || between.Fence <= first.Fence {
		t.Fatalf("a later instant's grant: %+v, %v", between, err)
	}
	try2 := bids.Token(run)
	if try2 == try1 || !strings.HasPrefix(try2, strings.TrimSuffix(try1, "1")) {
		t.Fatalf("second try's token %q: want the next try of %q", try2, try1)
	}
	asked := time.Now()
	second, err := claimOne(t, node, run, try2, "replica-a", time.Hour)
	if err != nil || second.Vote != redisnode.Granted || second.Fence <= between.Fence || second.Attempt != 1 {
		t.Fatalf("second try: %+v, %v; want the first try's grant (attempt 1) fenced above the grant before it (fence %d)", second, err, between.Fence)
	}
	if second.LeaseUntil.Before(asked.Add(time.Hour)) {
		t.Fatalf("second try's lease ends %s: want an hour from its request (%s), not the first try's minute", second.LeaseUntil, asked)
	}
	if r, err := claimOne(t, node, run, bids.Token(claim.Run{Job: "job.other", At: base}), "replica-a", time.Minute); err != nil || r.Vote != redisnode.Held {
		t.Fatalf("another bid of the same holder: %+v, %v; want held", r, err)
	}
	if r, err := claimOne(t, node, run, try1, "replica-a", time.Minute); err != nil || r.Vote != redisnode.Held || r.HolderKey != redisnode.TokenKey(try2) {
		t.Fatalf("the first try landing late: %+v, %v; want held by the second try", r, err)
	}
	if err := node.Abort(ctxT(t), run, try1); err != nil {
		t.Fatal(err)
	}
	cl := &claim.Claim{Run: run, Token: try2, Holder: "replica-a", Fence: second.Fence, Attempt: second.Attempt}
	if _, err := node.Renew(ctxT(t), cl, time.Minute, false); err != nil {
		t.Fatalf("renewal with the second try's token after the first's undo: %v", err)
	}
	old := *cl
	old.Token = try1
	if _, err := node.Renew(ctxT(t), &old, time.Minute, false); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("renewal with the first try's token: %v, want ErrLeaseLost", err)
	}
}

// TestBatchesOfOneAndManyReloadLostScripts: a batch goes as one script
// call per hundred runs, a lone call bare and several in a pipeline; each
// loads the scripts (and the library) again when the server lost them
// (SCRIPT FLUSH, FUNCTION FLUSH), and all agree on the
// outcome. The fences of one job's runs granted in one batch rise in the
// batch's order.
func TestBatchesOfOneAndManyReloadLostScripts(t *testing.T) {
	server := testenv.StartRedis(t)
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	node := newNamespace(t, client)
	for _, n := range []int{1, 3, 250} {
		runs, tokens := make([]claim.Run, n), make([]string, n)
		outs, ids := make([]claim.Status, n), make([]string, n)
		for i := range runs {
			runs[i], tokens[i] = claim.Run{Job: "job.reload", At: base.Add(time.Duration(1000*n+i) * time.Minute)}, claim.NewToken()
			outs[i], ids[i] = claim.Succeeded, runs[i].ID()
		}
		if err := client.ScriptFlush(ctxT(t)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := client.FunctionFlush(ctxT(t)).Err(); err != nil {
			t.Fatal(err)
		}
		replies, errs := node.ClaimBatch(ctxT(t), runs, tokens, "replica-a", time.Minute)
		for i := range runs {
			if errs[i] != nil || replies[i].Vote != redisnode.Granted {
				t.Fatalf("batch of %d, claim %d after SCRIPT FLUSH and FUNCTION FLUSH: %+v, %v", n, i, replies[i], errs[i])
			}
			if i > 0 && replies[i].Fence <= replies[i-1].Fence {
				t.Fatalf("batch of %d: claim %d got fence %d after %d", n, i, replies[i].Fence, replies[i-1].Fence)
			}
		}
		if err := client.ScriptFlush(ctxT(t)).Err(); err != nil {
			t.Fatal(err)
		}
		for i, err := range node.ReleaseBatch(ctxT(t), ids, tokens, outs) {
			if err != nil {
				t.Fatalf("batch of %d, release %d after SCRIPT FLUSH: %v", n, i, err)
			}
		}
		replies, errs = node.ClaimBatch(ctxT(t), runs, tokens, "replica-b", time.Minute)
		for i := range runs {
			if errs[i] != nil || replies[i].Vote != redisnode.Done {
				t.Fatalf("batch of %d, claim %d of a released run: %+v, %v; want done", n, i, replies[i], errs[i])
			}
		}
	}
}

// claimOne asks node for run alone (ClaimBatch sends a lone run's script
// without a pipeline).
func claimOne(t *testing.T, node *redisnode.Node, run claim.Run, token, holder string, lease time.Duration) (redisnode.Reply, error) {
	replies, errs := node.ClaimBatch(ctxT(t), []claim.Run{run}, []string{token}, holder, lease)
	return replies[0], errs[0]
}

// TestHistoryIsTrimmedPastAMargin: a job's history index is trimmed back to
// HistoryLimit once it is over by an eighth (at least one run), not on
// every claim, and always keeps the newest runs.
func TestHistoryIsTrimmedPastAMargin(t *testing.T) {
	client, p := isolated(t)
	if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
		t.Fatal(err)
	}
	const limit = 16 // margin: 2 runs
	node := redisnode.New(client, redisnode.Options{Prefix: p, HistoryLimit: limit}, 0, 1)
	trimmed := false
	for i := range 60 {
		run := claim.Run{Job: "job.trim", At: base.Add(time.Duration(i) * time.Minute)}
		if r, err := claimOne(t, node, run, claim.NewToken(), "replica-a", time.Minute); err != nil || r.Vote != redisnode.Granted {
			t.Fatalf("claim %d: %+v, %v", i, r, err)
		}
		recs, err := node.History(ctxT(t), "job.trim", 0)
		if err != nil {
			t.Fatal(err)
		}
		switch n := len(recs); {
		case n > limit+2:
			t.Fatalf("after %d claims the index holds %d runs, want at most %d", i+1, n, limit+2)
		case n < min(i+1, limit):
			t.Fatalf("after %d claims the index holds %d runs, want at least %d", i+1, n, min(i+1, limit))
		case !recs[0].At.Equal(run.At):
			t.Fatalf("after %d claims the newest run kept is %s, want %s", i+1, recs[0].At, run.At)
		case n == limit && i+1 > limit:
			trimmed = true
		}
	}
	if !trimmed {
		t.Fatal("the index was never trimmed back to its limit")
	}
}

// TestHistoriesPageOnWhereAPageIsNotTheAnswer: Histories reads one page
// per job in one pipeline; where that page is not the whole answer (runs
// in it expired, or no limit was asked and the index runs past the page)
// it reads the job again, and answers as History does.
func TestHistoriesPageOnWhereAPageIsNotTheAnswer(t *testing.T) {
	client, p := isolated(t)
	if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
		t.Fatal(err)
	}
	const limit = 8 // the index may hold 9
	node := redisnode.New(client, redisnode.Options{Prefix: p, HistoryLimit: limit}, 0, 1)
	at := func(i int) claim.Run { return claim.Run{Job: "job.page", At: base.Add(time.Duration(i) * time.Minute)} }
	for i := range limit + 1 {
		if r, err := claimOne(t, node, at(i), claim.NewToken(), "replica-a", time.Minute); err != nil || r.Vote != redisnode.Granted {
			t.Fatalf("claim %d: %+v, %v", i, r, err)
		}
	}
	if n, err := client.ZCard(ctxT(t), p+"runs:job.page").Result(); err != nil || n != limit+1 {
		t.Fatalf("index holds %d runs (%v), want %d: the test needs an index past its page", n, err, limit+1)
	}
	// Two of the newest four expire (their hashes go; the index keeps them).
	if err := client.Del(ctxT(t), p+"run:"+at(limit).ID(), p+"run:"+at(limit-2).ID()).Err(); err != nil {
		t.Fatal(err)
	}
	qs := []claim.HistoryQuery{{Job: "job.page", Limit: 4}, {Job: "job.page", Limit: 0}, {Job: "job.other", Limit: 4}}
	hists, err := node.Histories(ctxT(t), qs)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{limit - 1, limit - 3, limit - 4, limit - 5}, {limit - 1, limit - 3, limit - 4, limit - 5, limit - 6, limit - 7, limit - 8}, nil}
	for q, ids := range want {
		var got []string
		for _, r := range hists[q] {
			got = append(got, r.RunID)
		}
		var wantIDs []string
		for _, i := range ids {
			wantIDs = append(wantIDs, at(i).ID())
		}
		if !slices.Equal(got, wantIDs) {
			t.Errorf("query %+v: %v, want %v", qs[q], got, wantIDs)
		}
		one, err := node.History(ctxT(t), qs[q].Job, qs[q].Limit)
		if err != nil || len(one) != len(hists[q]) {
			t.Errorf("query %+v: History gave %d records (%v), Histories %d", qs[q], len(one), err, len(hists[q]))
		}
	}
}

// TestAServerThatRefusesWritesIsUnavailableToABatch: a batch script's runs
// fail one by one (a key of the wrong type fails its run alone), but a
// server that answers yet refuses every write is unavailable, as it was
// before batches, for every run of the call (the caller retries elsewhere
// or later), and is not ready (Ping).
func TestAServerThatRefusesWritesIsUnavailableToABatch(t *testing.T) {
	refusals := map[string]func(t *testing.T, client *goredis.Client){
		// A replica of a master nobody listens on: it keeps its data and
		// refuses writes (READONLY).
		"replica": func(t *testing.T, client *goredis.Client) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			_ = l.Close()
			if err := client.ReplicaOf(ctxT(t), "127.0.0.1", port).Err(); err != nil {
				t.Fatal(err)
			}
		},
		// Out of memory, evicting nothing (OOM).
		"out of memory": func(t *testing.T, client *goredis.Client) {
			if err := client.ConfigSet(ctxT(t), "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
		},
		// Too few replicas in sync for min-replicas-to-write (NOREPLICAS).
		"min-replicas": func(t *testing.T, client *goredis.Client) {
			if err := client.ConfigSet(ctxT(t), "min-replicas-to-write", "1").Err(); err != nil {
				t.Fatal(err)
			}
		},
		// The last snapshot failed and stop-writes-on-bgsave-error holds
		// (MISCONF): a save into /proc, where nobody can write.
		"failed snapshot": func(t *testing.T, client *goredis.Client) {
			for _, kv := range [][2]string{{"save", "3600 1"}, {"stop-writes-on-bgsave-error", "yes"}} {
				if err := client.ConfigSet(ctxT(t), kv[0], kv[1]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			_ = client.BgSave(ctxT(t)).Err()
			deadline := time.Now().Add(20 * time.Second)
			for {
				info, err := client.Info(ctxT(t), "persistence").Result()
				if err == nil && strings.Contains(info, "rdb_last_bgsave_status:err") && strings.Contains(info, "rdb_bgsave_in_progress:0") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the snapshot into /proc did not fail: %v\n%s", err, info)
				}
				time.Sleep(10 * time.Millisecond) // the fork's exit; no event to wait on
			}
		},
	}
	for name, refuse := range refusals {
		t.Run(name, func(t *testing.T) {
			var args []string
			if name == "failed snapshot" {
				args = []string{"--dir", "/proc"} // (a protected setting: not for CONFIG SET)
			}
			server := testenv.StartRedis(t, args...)
			client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
			defer client.Close()
			p := testenv.RandomPrefix(t.Name())
			if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
				t.Fatal(err)
			}
			node := redisnode.New(client, redisnode.Options{Prefix: p}, 0, 1)
			run := claim.Run{Job: "job.ro", At: base}
			token := claim.NewToken()
			if r, err := claimOne(t, node, run, token, "replica-a", time.Minute); err != nil || r.Vote != redisnode.Granted {
				t.Fatalf("claim before the server refused writes: %+v, %v", r, err)
			}
			if err := node.Ping(ctxT(t)); err != nil {
				t.Fatalf("ping before the server refused writes: %v", err)
			}
			refuse(t, client)
			// PING still answers PONG: the readiness probe must not.
			if err := node.Ping(ctxT(t)); !errors.Is(err, claim.ErrUnavailable) {
				t.Errorf("ping of a server refusing writes: %v, want ErrUnavailable", err)
			}
			for i, err := range node.ReleaseBatch(ctxT(t), []string{run.ID()}, []string{token}, []claim.Status{claim.Succeeded}) {
				if !errors.Is(err, claim.ErrUnavailable) {
					t.Errorf("release %d on a server refusing writes: %v, want ErrUnavailable", i, err)
				}
			}
			runs := []claim.Run{{Job: "job.ro", At: base.Add(time.Minute)}, {Job: "job.ro", At: base.Add(2 * time.Minute)}}
			_, errs := node.ClaimBatch(ctxT(t), runs, []string{claim.NewToken(), claim.NewToken()}, "replica-a", time.Minute)
			for i, err := range errs {
				if !errors.Is(err, claim.ErrUnavailable) {
					t.Errorf("claim %d on a server refusing writes: %v, want ErrUnavailable", i, err)
				}
			}
		})
	}
}

// TestAnUncommittedRedlockGrantSpendsNoAttempt: on a Redlock node (one
// fence slot of several) a grant counts as an attempt only once the
// quorum's commit reached it. A lapsed grant never committed (its quorum
// lost, its abort lost, or run by a stalled node after its caller gave
// up) is taken over at the same attempt; a committed one at the next; an
// aborted takeover goes back to the committed attempt. On a single
// server every grant stands at once, as before. (An outside review:
// nodes stalled under a claim round failed a run "attempt 2 exceeds
// max_attempts 1" that never started.)
func TestAnUncommittedRedlockGrantSpendsNoAttempt(t *testing.T) {
	const lease = 150 * time.Millisecond
	for _, tc := range []struct {
		name        string
		slots       int
		uncommitted int // the attempt a takeover of an uncommitted grant of attempt 1 gets
	}{{"redlock", 64, 1}, {"single", 1, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			client, p := isolated(t)
			if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
				t.Fatal(err)
			}
			node := redisnode.New(client, redisnode.Options{Prefix: p}, 0, tc.slots)
			run := claim.Run{Job: "job.attempts", At: base}
			takeOver := func(token string) redisnode.Reply {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for {
					r, err := claimOne(t, node, run, token, "replica", lease)
					if err == nil && r.Vote == redisnode.Granted {
						return r
					}
					if err != nil || r.Vote != redisnode.Held || time.Now().After(deadline) {
						t.Fatalf("takeover: %+v, %v", r, err)
					}
					time.Sleep(20 * time.Millisecond) // the lease lapses on the server's clock
				}
			}
			first := takeOver(claim.NewToken()) // granted, never committed
			if first.Attempt != 1 {
				t.Fatalf("fresh grant: attempt %d, want 1", first.Attempt)
			}
			tok := claim.NewToken()
			second := takeOver(tok)
			if second.Attempt != tc.uncommitted {
				t.Fatalf("takeover of an uncommitted grant: attempt %d, want %d", second.Attempt, tc.uncommitted)
			}
			if tc.slots == 1 {
				return
			}
			if ok, errs := node.CommitBatch(ctxT(t), []claim.Run{run}, []string{tok}, []int64{second.Fence}, []int{second.Attempt}); errs[0] != nil || !ok[0] {
				t.Fatalf("commit: %v, %v", ok, errs)
			}
			tok = claim.NewToken()
			if third := takeOver(tok); third.Attempt != 2 {
				t.Fatalf("takeover of a committed attempt 1: attempt %d, want 2", third.Attempt)
			}
			node.AbortBatch(ctxT(t), []claim.Run{run}, []string{tok})
			tok = claim.NewToken()
			again := takeOver(tok)
			if again.Attempt != 2 {
				t.Fatalf("takeover after an aborted attempt 2: attempt %d, want 2", again.Attempt)
			}
			// A renewal proves the grant stood where its commit did not
			// land: the next takeover counts on from it.
			cl := &claim.Claim{Run: run, Token: tok, Holder: "replica", Fence: again.Fence, Attempt: again.Attempt}
			if _, err := node.Renew(ctxT(t), cl, lease, true); err != nil {
				t.Fatalf("renewal: %v", err)
			}
			tok = claim.NewToken()
			after := takeOver(tok)
			if after.Attempt != 3 {
				t.Fatalf("takeover of a renewed, uncommitted attempt 2: attempt %d, want 3", after.Attempt)
			}
			// An abort after the commit landed (the caller left, or no
			// validity was left) goes back all the same.
			if ok, errs := node.CommitBatch(ctxT(t), []claim.Run{run}, []string{tok}, []int64{after.Fence}, []int{after.Attempt}); errs[0] != nil || !ok[0] {
				t.Fatalf("commit: %v, %v", ok, errs)
			}
			node.AbortBatch(ctxT(t), []claim.Run{run}, []string{tok})
			if last := takeOver(claim.NewToken()); last.Attempt != 3 {
				t.Fatalf("takeover after a committed, then aborted attempt 3: attempt %d, want 3", last.Attempt)
			}
			// A fresh grant committed, then aborted, is gone: the next
			// bid is attempt 1.
			fresh := claim.Run{Job: "job.attempts", At: base.Add(time.Minute)}
			tok = claim.NewToken()
			r, err := claimOne(t, node, fresh, tok, "replica", lease)
			if err != nil || r.Vote != redisnode.Granted || r.Attempt != 1 {
				t.Fatalf("fresh grant: %+v, %v", r, err)
			}
			if ok, errs := node.CommitBatch(ctxT(t), []claim.Run{fresh}, []string{tok}, []int64{r.Fence}, []int{1}); errs[0] != nil || !ok[0] {
				t.Fatalf("commit: %v, %v", ok, errs)
			}
			node.AbortBatch(ctxT(t), []claim.Run{fresh}, []string{tok})
			if r, err := claimOne(t, node, fresh, claim.NewToken(), "replica", lease); err != nil || r.Vote != redisnode.Granted || r.Attempt != 1 {
				t.Fatalf("bid after a committed, then aborted fresh grant: %+v, %v; want attempt 1", r, err)
			}
		})
	}
}
