package compare

import (
	"time"

	"github.com/scheduler-dev/scheduler/internal/faultproxy"
)

// link is the network between one replica and one backend address: a
// faultproxy the replica's client connects through.
type link interface {
	Addr() string
	SetLatency(d time.Duration)
	ResetAll()
	Partition(on bool)
	Close() error
}

func newLink(target string) (link, error) { return faultproxy.New(target) }
