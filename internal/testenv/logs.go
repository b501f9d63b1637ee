package testenv

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
)

// Logs is a log sink several goroutines write to (a runner's, a server's)
// and a test reads back.
type Logs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// JSONLines decodes every line that holds a JSON object (a JSON slog
// handler's records); other lines are left out.
func (l *Logs) JSONLines() []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}
