package redisnode

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// History lists the runs this node remembers, newest scheduled instant
// first; job "" means every job, limit <= 0 means all that are kept. A run
// whose hash has expired is skipped and dropped from its job's index.
func (n *Node) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	jobs := []string{job}
	if job == "" {
		var err error
		if jobs, err = n.jobs(ctx); err != nil {
			return nil, err
		}
	}
	var out []claim.Record
	for _, j := range jobs {
		recs, err := n.jobHistory(ctx, j, limit)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	SortRecords(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Histories answers each query as History would, in two pipelines for
// all of them: the jobs' index pages, then the pages' run hashes. A job
// whose full page held expired runs, or whose index may run past its page
// when no limit was asked, is read again alone (jobHistory pages on, and
// drops expired runs from its index).
func (n *Node) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	pages := make([]*goredis.StringSliceCmd, len(qs))
	size := func(q claim.HistoryQuery) int {
		if q.Limit <= 0 {
			return n.historyLimit
		}
		return q.Limit
	}
	if _, err := n.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, q := range qs {
			pages[i] = p.ZRevRange(ctx, n.keys.runs(q.Job), 0, int64(size(q))-1)
		}
		return nil
	}); err != nil {
		return nil, n.translate(ctx, err)
	}
	hashes := make([][]*goredis.SliceCmd, len(qs))
	if _, err := n.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i := range qs {
			for _, id := range pages[i].Val() {
				hashes[i] = append(hashes[i], p.HMGet(ctx, n.keys.run(id), recordFields...))
			}
		}
		return nil
	}); err != nil {
		return nil, n.translate(ctx, err)
	}
	hists := make([][]claim.Record, len(qs))
	for i, q := range qs {
		ids := pages[i].Val()
		for k, id := range ids {
			if rec, ok := record(id, hashes[i][k].Val()); ok {
				hists[i] = append(hists[i], rec)
			}
		}
		// A full page may not be the whole answer: runs past it are
		// wanted (no limit) or replace the expired ones in it.
		if len(ids) == size(q) && (q.Limit <= 0 || len(hists[i]) < len(ids)) {
			recs, err := n.jobHistory(ctx, q.Job, q.Limit)
			if err != nil {
				return nil, err
			}
			hists[i] = recs
		}
	}
	return hists, nil
}

// jobs lists the job names of every bucket's jobs set (one pipeline on
// a cluster), sorted.
func (n *Node) jobs(ctx context.Context) ([]string, error) {
	if n.keys.count() == 1 {
		jobs, err := n.client.SMembers(ctx, n.keys.jobs(0)).Result()
		return jobs, n.translate(ctx, err)
	}
	cmds := make([]*goredis.StringSliceCmd, n.keys.count())
	if _, err := n.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for b := range cmds {
			cmds[b] = p.SMembers(ctx, n.keys.jobs(b))
		}
		return nil
	}); err != nil {
		return nil, n.translate(ctx, err)
	}
	var jobs []string
	for _, c := range cmds {
		jobs = append(jobs, c.Val()...)
	}
	slices.Sort(jobs)
	return slices.Compact(jobs), nil
}

// jobHistory pages through one job's index, newest first, until it has
// limit live records or the index ends.
func (n *Node) jobHistory(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	page := int64(limit)
	if limit <= 0 {
		page = int64(n.historyLimit)
	}
	var out []claim.Record
	for start := int64(0); ; start += page {
		ids, err := n.client.ZRevRange(ctx, n.keys.runs(job), start, start+page-1).Result()
		if err != nil {
			return nil, n.translate(ctx, err)
		}
		if len(ids) == 0 {
			return out, nil
		}
		cmds := make([]*goredis.SliceCmd, len(ids))
		if _, err := n.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HMGet(ctx, n.keys.run(id), recordFields...)
			}
			return nil
		}); err != nil {
			return nil, n.translate(ctx, err)
		}
		var gone []any
		for i, id := range ids {
			rec, ok := record(id, cmds[i].Val())
			if !ok {
				gone = append(gone, id)
				continue
			}
			out = append(out, rec)
			if limit > 0 && len(out) == limit {
				return out, nil
			}
		}
		if len(gone) > 0 {
			// Expired runs; the next read need not page past them again.
			if err := n.client.ZRem(ctx, n.keys.runs(job), gone...).Err(); err != nil {
				return nil, n.translate(ctx, err)
			}
			start -= int64(len(gone))
		}
	}
}

// recordFields are the run hash's fields a record holds, in the order
// record reads them (HMGET's, and a claim script's page's).
var recordFields = []string{"status", "holder", "fence", "attempt", "started_at", "lease_until", "finished_at"}

// record decodes the recordFields of the run with id (each a string, or
// nil where the hash lacks it); ok is false if the hash is gone or
// malformed.
func record(id string, f []any) (claim.Record, bool) {
	if len(f) != len(recordFields) {
		return claim.Record{}, false
	}
	str := func(k int) string { v, _ := f[k].(string); return v }
	num := func(k int) int64 { v, _ := strconv.ParseInt(str(k), 10, 64); return v }
	if str(0) == "" {
		return claim.Record{}, false
	}
	run, err := claim.ParseID(id)
	if err != nil {
		return claim.Record{}, false
	}
	rec := claim.Record{
		RunID: id, Job: run.Job, At: run.At, Status: claim.Status(str(0)), Holder: str(1),
		Fence: num(2), Attempt: int(num(3)), StartedAt: ms(num(4)), LeaseUntil: ms(num(5)),
	}
	if str(6) != "" {
		rec.FinishedAt = ms(num(6))
	}
	return rec, true
}

// pageReply decodes a claim script's page: per run its id, then its
// recordFields, flat.
func pageReply(v any) ([]claim.Record, error) {
	vals, ok := v.([]any)
	if !ok || len(vals)%(1+len(recordFields)) != 0 {
		return nil, fmt.Errorf("redis: claim script's page %v", v)
	}
	page := make([]claim.Record, 0, len(vals)/(1+len(recordFields)))
	for i := 0; i < len(vals); i += 1 + len(recordFields) {
		id, _ := vals[i].(string)
		rec, ok := record(id, vals[i+1:i+1+len(recordFields)])
		if !ok {
			return nil, fmt.Errorf("redis: claim script's page holds %v", vals[i:i+1+len(recordFields)])
		}
		page = append(page, rec)
	}
	return page, nil
}

// SortRecords orders records newest scheduled instant first, then by job.
func SortRecords(recs []claim.Record) {
	slices.SortFunc(recs, func(a, b claim.Record) int {
		if c := b.At.Compare(a.At); c != 0 {
			return c
		}
		return cmp.Compare(a.Job, b.Job)
	})
}
