package redis

import "github.com/scheduler-dev/scheduler/internal/claim"

// DeferWatch keeps the done watcher of c, a *Claimer, from starting
// until the returned func is called: its first look at the server then
// comes as late as the test wants.
func DeferWatch(c claim.Claimer) (launch func()) {
	d := c.(*Claimer).done
	d.start.Do(func() {})
	return d.launch
}
