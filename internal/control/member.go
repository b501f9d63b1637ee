package control

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// memberPrefix keys each replica's presence (member/<instance>). Every
// replica renews its own entry as it reads the controls, with an expiry,
// so the unexpired entries are the replicas up now, as the backend sees
// them. The runner uses them only to share out runs due together (who
// bids first for which); nothing of exactly-once rests on them, so a
// view that is late or wrong costs lag or evenness, never a run.
const memberPrefix = "member/"

// Member is one replica's presence entry.
type Member struct {
	Instance string    `json:"instance"`
	At       time.Time `json:"at"` // when it last announced itself, on its clock
	// Incarnation is the writing Store's (Incarnation): two processes
	// announcing one instance name tell themselves apart by it.
	Incarnation string `json:"incarnation,omitempty"`
}

// Incarnation is a random name of this Store, written with its member
// entry: the process's, where one Store announces it.
func (s *Store) Incarnation() string { return s.incarnation }

// Announce records that instance is up, for ttl.
func (s *Store) Announce(ctx context.Context, instance string, ttl time.Duration) error {
	now := s.now()
	return s.putMember(ctx, instance, now, now.Add(ttl))
}

// Leave withdraws instance's announcement, as a replica that stops does:
// the others stop counting it at their next read, instead of after its
// entry expires. Its entry is overwritten by one that expired long ago
// (on any backend's clock), with a version above its announcements', so
// only a later Announce brings it back.
func (s *Store) Leave(ctx context.Context, instance string) error {
	return s.putMember(ctx, instance, s.now(), time.Unix(1, 0))
}

// putMember writes instance's entry, stamped at now, expiring at expires,
// at a version above the last this Store wrote (nextVersion): a
// replica's renewal (or its leave) never loses to its own older entry.
func (s *Store) putMember(ctx context.Context, instance string, now, expires time.Time) error {
	v, err := json.Marshal(Member{Instance: instance, At: now.UTC(), Incarnation: s.incarnation})
	if err != nil {
		return err
	}
	_, err = s.reg.Put(ctx, claim.Control{Key: memberPrefix + instance, Value: v, Version: s.nextVersion(now), Expires: expires})
	return err
}

// nextVersion returns the version of an entry this Store rewrites as its
// writer's state changes (its member entry, its unwatched runs): now, or
// one above the last it returned if that is later, so that versions only
// grow: a wall clock stepped back must not make a later write lose to an
// earlier one.
func (s *Store) nextVersion(now time.Time) int64 {
	version := now.UnixNano()
	for {
		last := s.version.Load()
		version = max(version, last+1)
		if s.version.CompareAndSwap(last, version) {
			return version
		}
	}
}

// Members lists the replicas whose announcement has not expired, by
// instance name.
func (s *Store) Members(ctx context.Context) ([]string, error) {
	cs, err := s.reg.List(ctx, memberPrefix)
	if err != nil {
		return nil, err
	}
	snap, err := decode(cs)
	return snap.Members, err
}

// Announcements are the replicas whose announcement has not expired, as
// they wrote it, by instance name.
func (s *Store) Announcements(ctx context.Context) ([]Member, error) {
	cs, err := s.reg.List(ctx, memberPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]Member, 0, len(cs))
	for _, c := range cs {
		var m Member
		if err := json.Unmarshal(c.Value, &m); err != nil {
			return nil, fmt.Errorf("control %s: %w", c.Key, err)
		}
		out = append(out, m)
	}
	return out, nil
}
