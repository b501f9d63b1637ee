package compare

import (
	"errors"
	"os/exec"
	"reflect"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/faultproxy"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// TestReplicasOpenThroughTheOpener checks that compare's replicas reach
// their backend the way `scheduler run` does: each replica's claimer, under
// the fault wrapper, is what claimers.Open returned (a *claimers.Backend of
// the cell's kind, wrapping the same claimer type claimers.Open gives for
// the namespace's configuration), the replicas share the namespace (a run
// one claims is held for the other), and under a network fault each
// replica's client dials its own proxy, not the server.
func TestReplicasOpenThroughTheOpener(t *testing.T) {
	kinds := map[string]func(t *testing.T) *Options{
		KindMemory: func(*testing.T) *Options { return &Options{} },
		KindSQLite: func(t *testing.T) *Options { return &Options{TempDir: t.TempDir()} },
		KindRedis:  func(t *testing.T) *Options { needRedisServer(t); return &Options{} },
		KindRedlock: func(t *testing.T) *Options {
			needRedisServer(t)
			return &Options{}
		},
		KindPostgres: func(t *testing.T) *Options { return &Options{PostgresDSN: testenv.PostgresDSN(t)} },
		KindEtcd: func(t *testing.T) *Options {
			if _, err := exec.LookPath("etcd"); err != nil {
				testenv.Missing(t, "etcd", "not on PATH: etcd cells start a private cluster")
			}
			return &Options{TempDir: testenv.FastDir(t)}
		},
	}
	for _, kind := range Kinds {
		for _, scenario := range []faultSet{{FaultNone}, {FaultPartition}} {
			if unsupported(&Options{}, kind, scenario) != "" {
				continue
			}
			t.Run(kind+"/"+scenario[0], func(t *testing.T) {
				o := kinds[kind](t)
				o.Replicas = 2
				ctx := t.Context()
				ns, err := openNamespace(ctx, o, kind, scenario)
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := ns.close(); err != nil {
						t.Error(err)
					}
				}()
				c := &cell{o: o, kind: kind, faults: scenario, plan: plan{offsets: make([]time.Duration, 2)},
					rec: newRecorder(time.Now()), ns: ns, stop: make(chan struct{})}
				err = c.openReplicas(ctx)
				defer c.closeReplicas()
				if err != nil {
					t.Fatal(err)
				}
				ref, err := claimers.Open(ctx, ns.ns.Config, "reference", claimers.Options{Migrate: true})
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				for _, rep := range c.reps {
					b, ok := rep.claimer.(*faulty).inner.(*claimers.Backend)
					if !ok {
						t.Fatalf("%s: claimer %T, want the *claimers.Backend claimers.Open returns", rep.id, rep.claimer.(*faulty).inner)
					}
					if b.Kind != kind || reflect.TypeOf(b.Claimer) != reflect.TypeOf(ref.Claimer) {
						t.Errorf("%s: %s claimer %T, want %s %T as claimers.Open gives", rep.id, b.Kind, b.Claimer, kind, ref.Claimer)
					}
					if err := rep.claimer.Ping(ctx); err != nil {
						t.Fatalf("%s: ping: %v", rep.id, err)
					}
					if scenario.network() {
						if len(rep.links) != len(ns.targets) || len(ns.targets) == 0 {
							t.Fatalf("%s: %d proxies for %d servers", rep.id, len(rep.links), len(ns.targets))
						}
						// A client may dial some servers after Ping
						// returns (etcd's connects to every member in
						// the background): wait for each, with a
						// deadline, rather than look once.
						for i, l := range rep.links {
							p := l.(*faultproxy.Proxy)
							for deadline := time.Now().Add(15 * time.Second); p.Links() == 0 && time.Now().Before(deadline); {
								time.Sleep(10 * time.Millisecond)
							}
							if p.Links() == 0 {
								t.Errorf("%s: no connection through its proxy to %s within 15s", rep.id, ns.targets[i])
							}
						}
					}
				}
				run := claim.Run{Job: "probe", At: time.Now().Truncate(time.Second)}
				if _, err := claim.ClaimOne(ctx, c.reps[0].claimer, run, time.Minute); err != nil {
					t.Fatalf("r1 claim: %v", err)
				}
				if _, err := claim.ClaimOne(ctx, c.reps[1].claimer, run, time.Minute); !errors.Is(err, claim.ErrHeld) {
					t.Errorf("r2 claim of r1's run: %v, want ErrHeld (one namespace)", err)
				}
			})
		}
	}
}

func needRedisServer(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Missing(t, "redis-server", "not on PATH")
	}
}
