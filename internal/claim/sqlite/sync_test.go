package sqlite

import (
	"path/filepath"
	"testing"
)

// TestSyncNormalIsOptIn: claims sync the WAL at every commit (FULL, 2)
// unless Options.SyncNormal asks for NORMAL (1), on every connection.
func TestSyncNormalIsOptIn(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want int
	}{{Options{}, 2}, {Options{SyncNormal: true}, 1}} {
		c, err := Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		// Two connections at once: the setting is per connection.
		conns := []interface{ Close() error }{}
		for range 2 {
			conn, err := c.db.Conn(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var got int
			if err := conn.QueryRowContext(t.Context(), "PRAGMA synchronous").Scan(&got); err != nil || got != tc.want {
				t.Errorf("%+v: PRAGMA synchronous = %d (%v), want %d", tc.opts, got, err, tc.want)
			}
			conns = append(conns, conn)
		}
		for _, conn := range conns {
			_ = conn.Close()
		}
		_ = c.Close()
	}
}
