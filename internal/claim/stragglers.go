package claim

import "sync"

// Stragglers runs work that outlives its caller (a merged batch its
// callers left, the undo of a grant nobody took) on goroutines of its
// own, and lets a Claimer's Close wait for it before the connections
// close, so that what it undoes still reaches the server.
//
// Unlike a sync.WaitGroup, Go may be called while Wait waits: a claim in
// flight as its Claimer closes (a process stopping, or a crashed
// replica's call the explorer lets run on) starts its batch or its undo
// then, and sync.WaitGroup forbids an Add from zero concurrent with a
// Wait (the race detector reports it). Wait returns once none is running,
// at some moment after it was called. The zero value is ready to use.
type Stragglers struct {
	mu      sync.Mutex
	running int
	idle    chan struct{} // closed when running drops to 0; nil when nobody waits
}

// Go runs f on a goroutine of its own.
func (s *Stragglers) Go(f func()) {
	s.mu.Lock()
	s.running++
	s.mu.Unlock()
	go func() {
		defer s.done()
		f()
	}()
}

func (s *Stragglers) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if s.running == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// Wait waits until no function started by Go is running.
func (s *Stragglers) Wait() {
	s.mu.Lock()
	if s.running == 0 {
		s.mu.Unlock()
		return
	}
	if s.idle == nil {
		s.idle = make(chan struct{})
	}
	idle := s.idle
	s.mu.Unlock()
	<-idle
}
