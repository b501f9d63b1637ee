package benchkit

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Nodes are private redis-server processes without persistence, for the
// Redlock rows when no nodes are given.
type Nodes struct {
	Addrs []string
	cmds  []*exec.Cmd
}

// StartRedisNodes starts n redis-server processes on free loopback ports.
func StartRedisNodes(n int, dir string) (*Nodes, error) {
	ns := &Nodes{}
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			ns.Stop()
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		d, err := os.MkdirTemp(dir, "redis-")
		if err != nil {
			ns.Stop()
			return nil, err
		}
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", d, "--daemonize", "no")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			ns.Stop()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			ns.Stop()
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		ns.cmds = append(ns.cmds, cmd)
		ready := make(chan bool, 1)
		go func() { // drains the log so the server never blocks on a full pipe
			sc := bufio.NewScanner(out)
			sent := false
			for sc.Scan() {
				if !sent && strings.Contains(sc.Text(), "Ready to accept connections") {
					ready <- true
					sent = true
				}
			}
			if !sent {
				ready <- false
			}
		}()
		select {
		case ok := <-ready:
			if !ok {
				ns.Stop()
				return nil, fmt.Errorf("redis-server on port %d exited", port)
			}
		case <-time.After(15 * time.Second):
			ns.Stop()
			return nil, fmt.Errorf("redis-server on port %d not ready after 15s", port)
		}
		ns.Addrs = append(ns.Addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	return ns, nil
}

// Stop kills every node it started and waits for it.
func (ns *Nodes) Stop() {
	for _, c := range ns.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	ns.cmds = nil
}
