//go:build testcontainers

// With -tags testcontainers, a service that is neither configured nor
// reachable locally is started in Docker through testcontainers-go, once
// per test binary; Ryuk removes the containers when the binary exits.
//
//	go test -tags testcontainers -race -count=1 ./...
package testenv

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

func init() {
	startPostgres = onceContainer(testcontainers.ContainerRequest{
		Image:        "postgres:15",
		Env:          map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust", "POSTGRES_DB": "test"},
		ExposedPorts: []string{"5432/tcp"},
		WaitingFor:   wait.ForLog("database system is ready to accept connections").WithOccurrence(2).WithStartupTimeout(2 * time.Minute),
	}, "5432/tcp", "postgres://postgres@%s/test?sslmode=disable")
	startRedis = onceContainer(testcontainers.ContainerRequest{
		Image:        "redis:7",
		Cmd:          []string{"redis-server", "--save", "", "--appendonly", "no"},
		ExposedPorts: []string{"6379/tcp"},
		WaitingFor:   wait.ForLog("Ready to accept connections").WithStartupTimeout(2 * time.Minute),
	}, "6379/tcp", "%s")
}

// onceContainer starts req on first use and returns its endpoint formatted
// into format.
func onceContainer(req testcontainers.ContainerRequest, port, format string) func() (string, error) {
	return sync.OnceValues(func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
		if err != nil {
			return "", fmt.Errorf("testcontainers %s: %w", req.Image, err)
		}
		ep, err := c.PortEndpoint(ctx, port, "")
		if err != nil {
			return "", fmt.Errorf("testcontainers %s: %w", req.Image, err)
		}
		return fmt.Sprintf(format, ep), nil
	})
}
