package etcd

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The key space under the claimer's prefix:
//
//	run/<job>/<instant>   the run's record (JSON): status, holder, token,
//	                      attempt, times. No lease while the run is live,
//	                      so its attempt count survives its holder; the
//	                      done lease once it is finished (see doneLease).
//	live/<job>/<instant>  the live claim: the holder's token, under the
//	                      lease of the grant or of the last renewal. etcd
//	                      deletes it when that lease expires, which is
//	                      what lets the next replica take the run over.
//	ctl/<key>             a control (JSON claim.Control).
//
// <job> is path-escaped, so no job's keys fall under another's prefix;
// <instant> is UTC with nine fractional digits, fixed width, so a job's
// keys sort by instant.
type keyspace string

const instantLayout = "2006-01-02T15:04:05.000000000Z"

func runSuffix(r claim.Run) string {
	return url.PathEscape(r.Job) + "/" + r.At.UTC().Format(instantLayout)
}

func (p keyspace) record(r claim.Run) string { return string(p) + "run/" + runSuffix(r) }
func (p keyspace) live(r claim.Run) string   { return string(p) + "live/" + runSuffix(r) }

// records and lives are the prefixes of job's records and live keys, or
// of every job's when job is "".
func (p keyspace) records(job string) string { return string(p) + "run/" + jobPart(job) }
func (p keyspace) lives(job string) string   { return string(p) + "live/" + jobPart(job) }

func jobPart(job string) string {
	if job == "" {
		return ""
	}
	return url.PathEscape(job) + "/"
}

func (p keyspace) control(key string) string { return string(p) + "ctl/" + key }
func (p keyspace) ping() string              { return string(p) + "ping" }

// record is a run as stored under run/.
type record struct {
	Job    string       `json:"job"`
	At     time.Time    `json:"at"`
	Status claim.Status `json:"status"`
	Token  string       `json:"token"`
	Holder string       `json:"holder"`
	// Fence is the grant's fence, written by every write after the
	// grant. The grant cannot know its own revision, so it writes 0 and
	// its Slot, and the fence is the record's ModRevision and Slot (see
	// fenceOf) until the next write.
	Fence      int64     `json:"fence,omitempty"`
	Slot       int64     `json:"slot,omitempty"`
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	LeaseUntil time.Time `json:"lease_until"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

func (r record) encode() string {
	b, err := json.Marshal(r)
	if err != nil {
		panic("etcd: encode record: " + err.Error()) // plain fields: cannot fail
	}
	return string(b)
}

func decodeRecord(key string, b []byte) (record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("etcd: record %s: %w", key, err)
	}
	return r, nil
}

// A fence is the etcd revision of the transaction that granted the claim,
// shifted left by slotBits, plus the grant's slot in that transaction
// (several runs of one job granted in one transaction share its
// revision). Revisions grow with every write to the cluster and survive
// restarts and leader changes, so fences grow strictly in grant order.
const slotBits = 8

// maxOps bounds the runs of one transaction: a nested transaction's own
// operations count against etcd's --max-txn-ops (default 128) together
// with the outer one's, and slots must fit slotBits.
const maxOps = 100

func fenceOf(revision, slot int64) int64 { return revision<<slotBits | slot }

// The token carries the grant's start (unix nanoseconds, base 36) after
// the random part, so that a renewal or release, which rewrites the whole
// record, can write the start back without reading it first.
func newToken(start time.Time) string {
	return claim.NewToken() + "." + strconv.FormatInt(start.UnixNano(), 36)
}

// startOf is the grant's start carried by token; zero for a token this
// claimer did not make (no write under it can succeed).
func startOf(token string) time.Time {
	_, s, ok := strings.Cut(token, ".")
	if !ok {
		return time.Time{}
	}
	ns, err := strconv.ParseInt(s, 36, 64)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// recordOf is the record of c as its holder rewrites it, its lease ending
// at until. It reads only what a claim never changes after its grant: a
// release may run while the holder's keep-alive renews the same claim,
// and a renewal rewrites c's lease fields.
func recordOf(c *claim.Claim, s claim.Status, until time.Time) record {
	return record{Job: c.Run.Job, At: c.Run.At.UTC(), Status: s, Token: c.Token, Holder: c.Holder,
		Fence: c.Fence, Attempt: c.Attempt, StartedAt: startOf(c.Token), LeaseUntil: until.UTC()}
}

// leaseSeconds is lease as an etcd lease TTL: whole seconds, rounded up,
// so the backend never holds a claim shorter than asked. (The cluster
// may round it up further, to its minimum TTL.)
func leaseSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}
