package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
)

// ClientConfig builds the client TLS configuration, or returns nil when TLS
// is not enabled.
func (t TLS) ClientConfig() (*tls.Config, error) {
	c, _, err := t.build()
	return c, err
}

// build also names the key (ca_file, cert_file, key_file) a failure belongs to.
func (t TLS) build() (*tls.Config, string, error) {
	if !t.Enabled {
		return nil, "", nil
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // the operator's explicit choice, documented as testing only
	}
	if t.CAFile != "" {
		pem, err := readSmall(t.CAFile)
		if err != nil {
			return nil, "ca_file", err
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, "ca_file", errors.New("no PEM certificate found")
		}
	}
	switch {
	case t.CertFile == "" && t.KeyFile == "":
	case t.KeyFile == "":
		return nil, "key_file", errors.New("missing: cert_file needs key_file")
	case t.CertFile == "":
		return nil, "cert_file", errors.New("missing: key_file needs cert_file")
	default:
		certPEM, err := readSmall(t.CertFile)
		if err != nil {
			return nil, "cert_file", err
		}
		keyPEM, err := readSmall(t.KeyFile)
		if err != nil {
			return nil, "key_file", err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, "cert_file", err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, "", nil
}

// maxFileSize bounds password, CA and key files, so that a path such as
// /dev/zero cannot hang start-up.
const maxFileSize = 1 << 20

// readSmall reads a file of at most maxFileSize bytes; errors omit the path,
// which the caller shows as the value.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", withoutPath(err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("cannot read: %w", withoutPath(err))
	case len(b) > maxFileSize:
		return nil, fmt.Errorf("larger than %d bytes", maxFileSize)
	}
	return b, nil
}

// withoutPath drops the path from an *os.PathError.
func withoutPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
