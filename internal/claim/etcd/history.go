package etcd

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// liveSlack is how long past the reading History reports a running run's
// lease when its live key is still there: etcd, not the lease_until a
// replica wrote on its own clock, says whether the lease holds, and the
// reader compares the time on its own clock, a moment later.
const liveSlack = time.Second

// History implements claim.Claimer: one read of the records and the live
// keys, of job or of every job, at one revision. A job's records come
// newest first from the key order; every job's are sorted here, newest
// instant first, then by job. limit <= 0 means no limit.
//
// Times are the writing replica's clock (etcd has none to offer). A
// running record's lease_until is corrected by its live key: past if
// etcd deleted the key, at least liveSlack ahead while it holds.
func (c *Claimer) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	resp, err := c.cli.Txn(ctx).Then(c.historyOps(job, limit)...).Commit()
	if err != nil {
		return nil, fmt.Errorf("history: %w", c.translate(ctx, err))
	}
	recs, err := c.records(resp.Responses[0], resp.Responses[1], time.Now())
	if err != nil {
		return nil, err
	}
	if job == "" {
		slices.SortFunc(recs, func(a, b claim.Record) int {
			return cmp.Or(b.At.Compare(a.At), strings.Compare(a.Job, b.Job))
		})
		if limit > 0 && len(recs) > limit {
			recs = recs[:limit]
		}
	}
	return recs, nil
}

// historyQueries is how many jobs one transaction of Histories reads: two
// reads each, within etcd's default --max-txn-ops (128).
const historyQueries = 60

var _ claim.Historian = (*Claimer)(nil)

// Histories implements claim.Historian: historyQueries jobs per
// transaction, the transactions sent at once. Each job is read at one
// revision, as History reads it; different jobs may be read at different
// revisions, as separate History calls would be.
func (c *Claimer) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	hists := make([][]claim.Record, len(qs))
	errs := make([]error, (len(qs)+historyQueries-1)/historyQueries)
	var wg sync.WaitGroup
	for k := range errs {
		lo, hi := k*historyQueries, min(len(qs), (k+1)*historyQueries)
		wg.Go(func() {
			var ops []clientv3.Op
			for _, q := range qs[lo:hi] {
				ops = append(ops, c.historyOps(q.Job, q.Limit)...)
			}
			resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				errs[k] = fmt.Errorf("history: %w", c.translate(ctx, err))
				return
			}
			now := time.Now()
			for i := lo; i < hi; i++ {
				at := 2 * (i - lo)
				if hists[i], err = c.records(resp.Responses[at], resp.Responses[at+1], now); err != nil {
					errs[k] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return hists, nil
}

// historyOps reads job's records (every job's if job is ""), newest first,
// at most limit (<= 0: all), and its live keys.
func (c *Claimer) historyOps(job string, limit int) []clientv3.Op {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if job != "" {
		opts = append(opts, clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
		if limit > 0 {
			opts = append(opts, clientv3.WithLimit(int64(limit)))
		}
	}
	return []clientv3.Op{
		clientv3.OpGet(c.keys.records(job), opts...),
		clientv3.OpGet(c.keys.lives(job), clientv3.WithPrefix()),
	}
}

// records decodes a read of historyOps, as of now on this clock.
func (c *Claimer) records(recResp, liveResp *etcdserverpb.ResponseOp, now time.Time) ([]claim.Record, error) {
	recPrefix, livePrefix := c.keys.records(""), c.keys.lives("")
	holds := map[string]string{} // run suffix → token
	for _, kv := range liveResp.GetResponseRange().GetKvs() {
		holds[strings.TrimPrefix(string(kv.Key), livePrefix)] = string(kv.Value)
	}
	kvs := recResp.GetResponseRange().GetKvs()
	recs := make([]claim.Record, 0, len(kvs))
	for _, kv := range kvs {
		key := string(kv.Key)
		r, err := decodeRecord(key, kv.Value)
		if err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
		run := claim.Run{Job: r.Job, At: r.At.UTC()}
		rec := claim.Record{RunID: run.ID(), Job: r.Job, At: run.At, Status: r.Status, Holder: r.Holder,
			Fence: r.Fence, Attempt: r.Attempt, StartedAt: r.StartedAt.UTC(), LeaseUntil: r.LeaseUntil.UTC(),
			FinishedAt: r.FinishedAt.UTC()}
		if r.FinishedAt.IsZero() {
			rec.FinishedAt = time.Time{}
		}
		if rec.Fence == 0 {
			rec.Fence = fenceOf(kv.ModRevision, r.Slot)
		}
		if rec.Status == claim.Running {
			if holds[strings.TrimPrefix(key, recPrefix)] == r.Token {
				rec.LeaseUntil = later(rec.LeaseUntil, now.Add(liveSlack).UTC())
			} else if rec.LeaseUntil.After(now) {
				rec.LeaseUntil = now.UTC()
			}
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
