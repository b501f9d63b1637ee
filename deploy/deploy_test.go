// Package deploy_test checks that the shipped container and Kubernetes
// manifests agree with the scheduler's configuration and its defaults.
package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/scheduler-dev/scheduler/internal/config"
)

type manifest struct {
	Kind string `yaml:"kind"`
	Data map[string]string
	Spec struct {
		Replicas     int            `yaml:"replicas"`
		MinAvailable int            `yaml:"minAvailable"`
		Selector     map[string]any `yaml:"selector"`
		Template     struct {
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
				} `yaml:"securityContext"`
				Containers []struct {
					Args  []string `yaml:"args"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					LivenessProbe  probe `yaml:"livenessProbe"`
					ReadinessProbe probe `yaml:"readinessProbe"`
					VolumeMounts   []struct {
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

func load(t *testing.T) map[string]manifest {
	t.Helper()
	out := map[string]manifest{}
	files, _ := filepath.Glob("k8s/*.yaml")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var m manifest
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out[m.Kind] = m
		}
	}
	return out
}

func TestManifestsAgreeWithTheConfig(t *testing.T) {
	m := load(t)
	for _, kind := range []string{"Deployment", "ConfigMap", "Secret", "PodDisruptionBudget", "Service"} {
		if _, ok := m[kind]; !ok {
			t.Fatalf("no %s manifest", kind)
		}
	}
	// The ConfigMap's config must load and validate as the binary would.
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(m["ConfigMap"].Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "postgres-password"), []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	text, _ := os.ReadFile(path)
	if err := os.WriteFile(path, bytes.ReplaceAll(text, []byte("/etc/scheduler/secrets"), []byte(secrets)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOSTNAME", "scheduler-0")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("ConfigMap config: %v", err)
	}
	shipped := map[string]bool{"billing.nightly": true, "example.sleep": true}
	if err := cfg.Validate(func(j string) bool { return shipped[j] }); err != nil {
		t.Fatalf("ConfigMap config: %v", err)
	}

	d := m["Deployment"].Spec
	if d.Replicas != 3 {
		t.Errorf("replicas = %d, want 3", d.Replicas)
	}
	pod := d.Template.Spec
	grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second
	if grace <= cfg.ShutdownGrace.Duration()+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v must exceed shutdown_grace %v with room to release claims", grace, cfg.ShutdownGrace)
	}
	if def := config.Default().ShutdownGrace.Duration(); grace <= def {
		t.Errorf("terminationGracePeriodSeconds %v must exceed the default shutdown_grace %v too", grace, def)
	}
	if !pod.SecurityContext.RunAsNonRoot {
		t.Error("pods must run as non-root")
	}
	c := pod.Containers[0]
	_, port, _ := net.SplitHostPort(cfg.HTTP.Addr)
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || port != "8080" || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("container port %+v does not match http.addr %q", c.Ports, cfg.HTTP.Addr)
	}
	if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		c.LivenessProbe.HTTPGet.Port != "http" || c.ReadinessProbe.HTTPGet.Port != "http" {
		t.Errorf("probes: liveness %+v readiness %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	if strings.Join(c.Args, " ") != "run --config /etc/scheduler/config.yaml" {
		t.Errorf("args %v", c.Args)
	}
	mounts := map[string]bool{}
	for _, v := range c.VolumeMounts {
		mounts[v.MountPath] = true
	}
	if !mounts["/etc/scheduler/config.yaml"] || !mounts["/etc/scheduler/secrets"] {
		t.Errorf("mounts %v lack the config or the secrets", mounts)
	}
	if cfg.Claimer.Postgres.PasswordFile == "" || strings.Contains(cfg.Claimer.Postgres.DSN, ":pw@") {
		t.Error("the password must come from the Secret file, not the DSN")
	}
	if pdb := m["PodDisruptionBudget"].Spec; pdb.MinAvailable < 2 || pdb.MinAvailable >= d.Replicas {
		t.Errorf("PDB minAvailable %d: want a standby kept (>= 2) and drains possible (< replicas %d)", pdb.MinAvailable, d.Replicas)
	}
}

func TestDockerfileBuildsAStaticNonRootImage(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"CGO_ENABLED=0", "FROM scratch", "USER 65532", "./cmd/scheduler", `"run", "--config", "/etc/scheduler/config.yaml"`} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}
